"""One home per backend (DESIGN.md, "One design"): outside
`advtrain/backend/`, no module compares the Keras backend's name or branches
on TensorFlow being importable; it asks `advtrain.backend` (`HOST_LOOPS`,
`IMPORTS_TENSORFLOW`, `HAS_TENSORFLOW`, `is_dataset`, ...) instead.

Messages may still print a backend's name (an f-string is not a branch),
and catching a failed TensorFlow import to reword its error is not a branch
on it either.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "advtrain"
HOME = PACKAGE / "backend"

# Keras's backend names (its `keras.backend.backend()` values).
KERAS_BACKENDS = {"tensorflow", "jax", "torch", "numpy", "openvino"}
# Words in an expression that hold a backend's name, compared with one of
# KERAS_BACKENDS: `runtime.backend`, `os.environ`, `sys.modules`.
_NAME_HOLDERS = ("backend", "environ", "modules")
_TENSORFLOW_NAMES = {"tf", "tensorflow"}


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def _called(node: ast.AST, name: str) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return getattr(func, "attr", getattr(func, "id", None)) == name


def _first_argument(node: ast.Call):
    arg = node.args[0] if node.args else None
    return arg.value if isinstance(arg, ast.Constant) else None


def _reads_keras_backend_variable(node: ast.AST) -> bool:
    # os.environ.get("KERAS_BACKEND"), os.getenv(...), os.environ[...]
    if isinstance(node, ast.Call) and (_called(node, "get") or _called(node, "getenv")):
        return _first_argument(node) == "KERAS_BACKEND"
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "KERAS_BACKEND"
    return False


def _names_backend(node: ast.AST, aliases: set[str]) -> bool:
    """Whether `node` evaluates to the running backend's name."""
    if isinstance(node, ast.Call) and not node.args and _called(node, "backend"):
        return True  # keras.backend.backend()
    if isinstance(node, ast.Attribute) and node.attr == "NAME":
        return _text(node.value).endswith("backend")  # advtrain.backend.NAME
    if isinstance(node, ast.Name) and node.id in aliases:
        return True
    return _reads_keras_backend_variable(node)


def _tensorflow_or_absent(node: ast.AST) -> bool:
    """`tf`, `tensorflow_or_none()`, `sys.modules.get("tensorflow")`."""
    if isinstance(node, ast.Name):
        return node.id in _TENSORFLOW_NAMES
    if _called(node, "tensorflow_or_none"):
        return True
    return _called(node, "get") and _first_argument(node) == "tensorflow"


def _aliases(tree: ast.AST) -> set[str]:
    """Names assigned the backend's name (`running = keras.backend.backend()`)."""
    names: set[str] = set()
    for _ in range(2):  # an alias of an alias
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _names_backend(node.value, names):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _comparison(node: ast.Compare, aliases: set[str]) -> bool:
    sides = [node.left, *node.comparators]
    if any(_names_backend(side, aliases) for side in sides):
        return True
    named = [
        s for s in sides if isinstance(s, ast.Constant) and s.value in KERAS_BACKENDS
    ]
    others = [s for s in sides if s not in named]
    if named and any(w in _text(o) for o in others for w in _NAME_HOLDERS):
        return True  # runtime.backend == "jax", "tensorflow" in sys.modules
    if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
        return any(_tensorflow_or_absent(side) for side in sides)
    return False


def _tests(tree: ast.AST):
    """The conditions of every branch: if, while, a ternary, `and`/`or`, `not`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            yield node.test
        elif isinstance(node, ast.BoolOp):
            yield from node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node.operand


def _in_messages(tree: ast.AST) -> set[int]:
    """ids of the nodes inside f-strings: a message may print the name."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for inner in ast.walk(node)
    }


def backend_branches(source: str, where: str = "<source>") -> list[str]:
    """`where:line: code` for each comparison of the Keras backend's name
    and each branch on TensorFlow being importable in `source`."""
    tree = ast.parse(source)
    aliases, messages = _aliases(tree), _in_messages(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in messages:
            continue
        if isinstance(node, ast.Compare) and _comparison(node, aliases):
            found.append(node)
        elif _called(node, "find_spec") and str(_first_argument(node)).startswith(
            "tensorflow"
        ):
            found.append(node)
        elif _reads_keras_backend_variable(node):
            found.append(node)
    found += [t for t in _tests(tree) if _tensorflow_or_absent(t)]
    return sorted(
        {f"{where}:{node.lineno}: {_text(node)}" for node in found},
        key=lambda line: int(line.split(":")[1]),
    )


FLAGGED = [
    'import keras\nif keras.backend.backend() == "jax":\n    pass\n',
    'from keras import backend\nx = backend.backend() != "tensorflow"\n',
    'import keras\nok = keras.backend.backend() in ("tensorflow", "jax")\n',
    'import keras\nrunning = keras.backend.backend()\nif running == "jax":\n    pass\n',
    'from advtrain import backend\nif backend.NAME == "jax":\n    pass\n',
    'def f(runtime):\n    return runtime.backend != "jax"\n',
    'import os\nif os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":\n'
    "    pass\n",
    'import os\nchosen = os.environ["KERAS_BACKEND"]\n',
    'import importlib.util\nok = importlib.util.find_spec("tensorflow") is None\n',
    'from importlib.util import find_spec\nif find_spec("tensorflow"):\n    pass\n',
    "tf = None\nif tf is None:\n    pass\n",
    "tf = None\nx = tf is not None and isinstance(1, tf.data.Dataset)\n",
    "from advtrain.data.errors import tensorflow_or_none\n"
    "if tensorflow_or_none() is not None:\n    pass\n",
    'import sys\ntf = sys.modules.get("tensorflow")\nok = tf is None\n',
    'import sys\nloaded = "tensorflow" in sys.modules\n',
    "tf = None\nif not tf:\n    pass\n",
]

ALLOWED = [
    # Asking the backend, printing its name, another kind of "backend".
    "from advtrain import backend\nif backend.HOST_LOOPS:\n    pass\n",
    "from advtrain import backend\nx = backend.is_dataset(1)\n",
    'import keras\nraise ValueError(f"Received: {keras.backend.backend()}")\n',
    "import os\nraise ValueError(f\"{os.environ.get('KERAS_BACKEND')}\")\n",
    'def f(attack):\n    return attack.backend == "advtrain"\n',
    'def f(self):\n    return self.mode == "torch"\n',
    "import tensorflow as tf\nx = tf.zeros(3)\n",
    "def f(x):\n    return x is None\n",
]


@pytest.mark.parametrize("source", FLAGGED)
def test_the_checker_flags_a_backend_branch(source):
    assert backend_branches(source), source


@pytest.mark.parametrize("source", ALLOWED)
def test_the_checker_leaves_questions_to_the_backend_alone(source):
    assert backend_branches(source) == []


def test_no_module_outside_the_backend_home_branches_on_the_backend():
    modules = sorted(p for p in PACKAGE.rglob("*.py") if HOME not in p.parents)
    assert len(modules) > 50  # the whole package was read
    found = [
        line
        for path in modules
        for line in backend_branches(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert not found, (
        "ask advtrain.backend instead (HOST_LOOPS, IMPORTS_TENSORFLOW, "
        "HAS_TENSORFLOW, is_dataset, ...):\n" + "\n".join(found)
    )


def test_each_backend_has_its_package_and_the_same_names():
    packages = sorted(p.parent.name for p in HOME.glob("*/__init__.py"))
    assert packages == ["jax", "tensorflow", "torch"]
    exported = {
        name: ast.literal_eval(
            next(
                node.value
                for node in ast.parse((HOME / name / "__init__.py").read_text()).body
                if isinstance(node, ast.Assign) and _text(node.targets[0]) == "__all__"
            )
        )
        for name in packages
    }
    assert exported["jax"] == exported["tensorflow"] == exported["torch"]
    for name in packages:
        assert {p.stem for p in (HOME / name).glob("*.py")} == {
            "__init__",
            "ops",
            "trainer",
            "distribution",
        }
