"""Recipe validation: one line, naming the file and key, exit 2, nothing written."""

import pytest
import yaml
from typer.testing import CliRunner

from advtrain.cli.commands import app
from advtrain.recipe.loader import load_recipe, recipe_from_dict
from advtrain.recipe.schema import RecipeError

runner = CliRunner()

GOOD = {"data": {"source": "digits"}, "train": {"epochs": 1}}

# (recipe text, extra CLI args, expected fragment of the one-line message)
BAD = [
    (
        "attack: {epss: 0.1}",
        [],
        "unknown key 'attack.epss'. Did you mean 'attack.eps'?",
    ),
    ("trian: {epochs: 1}", [], "unknown key 'trian'. Did you mean 'train'?"),
    # Attack values: the library's rules, reported under the recipe key.
    ("attack: {eps: -0.1}", [], "attack.eps: must be a finite number >= 0"),
    ("attack: {eps: 1.5}", [], "attack.eps: must be <= 1, the width of the pixel"),
    ("attack: {adv_weight: 1.2}", [], "attack.adv_weight: must be between 0.0"),
    ("attack: {adv_weight: -0.1}", [], "attack.adv_weight"),
    (
        "train: {epochs: -3}",
        [],
        "'train.epochs': Input should be greater than or equal to 0",
    ),
    ("train: {epochs: many}", [], "'train.epochs': Input should be a valid integer"),
    ("train: {batch_size: 0}", [], "'train.batch_size'"),
    (
        "attack: {method: deepfool}",
        [],
        "'attack.method': unknown attack 'deepfool'",
    ),
    ("attack: {norm: 1}", [], "attack.norm: must be 'inf'"),
    # Keys renamed in 0.2 name their new names.
    (
        "model: {warmup_epochs: 1}",
        [],
        "'model.warmup_epochs' was renamed 'model.head_only_epochs'",
    ),
    ("attack: {fused: true}", [], "'attack.fused' was renamed 'attack.reuse_gradient'"),
    (
        "attack: {fused_step: true}",
        [],
        "'attack.fused_step' was renamed 'attack.reuse_gradient' in 0.3",
    ),
    (
        "model: {batchnorm: {fused: false}}",
        ["--set", "train.epochs=1"],
        "'model.batchnorm.fused' was renamed 'model.batchnorm.fused_kernel'",
    ),
    (
        "attack: {method: fgsm_rs, backend: cleverhans}",
        [],
        "attack.backend: the cleverhans backend provides methods fgsm and pgd",
    ),
    (
        "attack: {method: pgd, clip_start: false}",
        [],
        "attack.clip_start: pgd does not take clip_start; it takes eps, steps, "
        "step_size, norm, random_start, restarts, clip_min, clip_max. "
        "Received: clip_start=False",
    ),
    # The case: a key another method takes, set for fgsm.
    (
        "attack: {method: fgsm, steps: 50, step_size: 0.3}",
        [],
        "attack.steps: fgsm does not take steps; it takes eps, norm, clip_min, "
        "clip_max. Received: steps=50",
    ),
    (
        "attack: {method: pgd, options: {alpha: 0.5}}",
        [],
        "'alpha' has a key of its own: set attack.alpha",
    ),
    ("model: {batchnorm: {fused_kernel: maybe}}", [], "'model.batchnorm.fused_kernel'"),
    ("data: {source: imagenet}", [], "'data.source'"),
    ("runtime: {precision: float8}", [], "'runtime.precision'"),
    (
        "runtime: {steps_per_execution: 0}",
        [],
        "steps_per_execution must be 'auto' or >= 1",
    ),
    ("eval: {eps_sweep: [0.1, 2.0]}", [], "eps_sweep values must be in [0, 1]"),
    ("model: {freeze: top_k}", [], "top_k"),
    ("attack: {eps: 0.1", [], "invalid YAML"),
    (
        "attack: !!python/object/apply:os.system [echo hi]",
        [],
        "tags that build Python objects are not allowed",
    ),
    ("train: {epochs: 1}\ntrain: {epochs: 2}", [], "duplicate key 'train'"),
    ("- just\n- a list", [], "a recipe must be a mapping of sections"),
    ("{}", ["--set", "attack.eps"], "--set: expected section.key=value"),
    ("{}", ["--set", "attack.epz=0.1"], "unknown key 'attack.epz'"),
    ("{}", ["--set", "attack.eps=2"], "attack.eps: must be <= 1"),
    ("name: mine", ["--set", "name.x=1"], "'name' is a value, not a section"),
    ("train: {batch_size: 5000}", [], "larger than the training set"),
    # Checkpointing and the run folder (issue #6).
    ("output: {keep_checkpoints: 0}", [], "'output.keep_checkpoints'"),
    ("output: {checkpoint_every_steps: 0}", [], "'output.checkpoint_every_steps'"),
    ("output: {checkpoint_every_epochs: 0}", [], "'output.checkpoint_every_epochs'"),
    ("output: {monitr: adv_accuracy}", [], "Did you mean 'output.monitor'?"),
    ("output: {monitor: Val-Acc}", [], "'output.monitor'"),
    ("output: {monitor_mode: biggest}", [], "'output.monitor_mode'"),
    (
        "output: {monitor: val_adv_accuracy}",
        [],
        "bad.yaml: output.monitor: a validation metric needs a validation "
        "split; set val_fraction > 0",
    ),
    (
        "output: {monitor: adv_acc}",
        [],
        "bad.yaml: output.monitor: not a metric of this run",
    ),
    ("train: {learning_rate: 0}", [], "'train.learning_rate'"),
    ("runtime: {strategy: tpu}", [], "bad.yaml: runtime.strategy: no TPU found"),
    ("runtime: {backend: mxnet}", [], "'runtime.backend'"),
    (
        "data: {source: mnist, path: /nonexistent/mnist}",
        [],
        "bad.yaml: data.path /nonexistent/mnist: not found.",
    ),
    ("{}", ["--set", "output.keep_checkpoints=-1"], "'output.keep_checkpoints'"),
]

TINY = (
    "data: {source: digits, limit_train: 64}\n"
    "model: {width: 4}\n"
    "train: {epochs: 1, batch_size: 32}\n"
)


@pytest.mark.parametrize("text,args,fragment", BAD)
def test_bad_recipe_is_one_line_exit_2_nothing_written(tmp_path, text, args, fragment):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(recipe), "--output", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert fragment in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def _other_run(tmp_path, out):
    # A run folder of another recipe (no training needed to refuse it).
    out.mkdir()
    (out / "recipe.yaml").write_text(
        load_recipe(_write(tmp_path, "other.yaml", TINY), ["train.epochs=5"]).to_yaml()
    )
    (out / "history.csv").write_text("epoch,loss\n0,1.0\n")


def _not_a_run(tmp_path, out):
    out.mkdir()
    (out / "notes.txt").write_text("mine")


def _bad_saved_recipe(tmp_path, out):
    out.mkdir()
    (out / "recipe.yaml").write_text("attack: {epss: 0.1}")


def _finished(tmp_path, out):
    _other_run(tmp_path, out)
    (out / "recipe.yaml").write_text(
        load_recipe(_write(tmp_path, "r.yaml", TINY)).to_yaml()
    )
    (out / "metrics.json").write_text("{}")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# (prepare the folder, command, expected fragment of the one-line message)
BAD_CLI = [
    (_other_run, "run", "different recipe (train.epochs: 5 -> 1)"),
    (
        _other_run,
        "run-set",
        "different recipe (attack.eps: 0.03137254901960784 -> 0.2; train.epochs: 5 -> 1)",  # noqa: E501
    ),
    (_not_a_run, "run", "holds no advtrain run (no recipe.yaml)"),
    (_finished, "run", "holds a finished run of this recipe"),
    (None, "resume", "run folder not found"),
    (_not_a_run, "resume", "not a run folder (no recipe.yaml)"),
    (_bad_saved_recipe, "resume", "recipe.yaml: unknown key 'attack.epss'"),
    (_finished, "resume", "the run is finished"),
    (None, "eval", "not found (expected a run folder or a .keras file)"),
]


@pytest.mark.parametrize("prepare,command,fragment", BAD_CLI)
def test_bad_cli_use_is_one_line_exit_2_nothing_changed(
    tmp_path, prepare, command, fragment
):
    out = tmp_path / "out"
    if prepare is not None:
        prepare(tmp_path, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if out.is_dir() else None
    recipe = _write(tmp_path, "r.yaml", TINY)
    args = {
        "run": ["run", str(recipe), "--output", str(out)],
        "run-set": [
            "run",
            str(recipe),
            "--output",
            str(out),
            "--set",
            "attack.eps=0.2",
        ],
        "resume": ["resume", str(out)],
        "eval": [
            "eval",
            str(out / "model.keras"),
            "--recipe",
            str(recipe),
            "--unsafe-load",
        ],
    }[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert fragment in lines[0]
    assert "Traceback" not in result.output
    after = {p.name: p.read_bytes() for p in out.iterdir()} if out.is_dir() else None
    assert after == before


def test_bad_input_table_size():
    assert len(BAD) + len(BAD_CLI) >= 40


def test_error_names_the_recipe_file(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("attack: {eps: 3}")
    with pytest.raises(
        RecipeError,
        match=r"mine\.yaml: attack\.eps: must be <= 1.*Received: eps=3",
    ):
        load_recipe(recipe)


def test_attack_rules_live_in_the_library_and_recipes_name_the_key():
    from advtrain.attacks import Attack
    from advtrain.models.adversarial import AdversarialModel
    from advtrain.utils.errors import ArgumentError

    with pytest.raises(ArgumentError) as library:
        Attack("pgd", eps=1.5)
    assert library.value.argument == "eps" and "attack." not in str(library.value)
    with pytest.raises(RecipeError, match=r"^r\.yaml: attack\.eps: ") as recipe:
        recipe_from_dict({"attack": {"method": "pgd", "eps": 1.5}}, "r.yaml")
    assert library.value.message in str(recipe.value)
    # The training model's own arguments: the constructor's rules, by the
    # recipe key that filled each (attack.mode fills attack_mode).
    with pytest.raises(ArgumentError, match="attack_mode: must be one of"):
        AdversarialModel.check_arguments(Attack("pgd", eps=0.1), attack_mode="eval")
    with pytest.raises(RecipeError, match=r"^r\.yaml: attack\.mode: must be one"):
        recipe_from_dict({"attack": {"mode": "eval"}}, "r.yaml")
    # L2 balls are not bounded by the pixel range.
    assert recipe_from_dict({"attack": {"norm": 2, "eps": 1.5}}).attack.eps == 1.5


def test_missing_recipe_file_lists_shipped_ones(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "recipe file not found" in result.output


def test_overrides_parse_yaml_values(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(GOOD))
    loaded = load_recipe(
        recipe,
        [
            "attack.eps=0.25",
            "eval.eps_sweep=[0, 0.1]",
            "runtime.jit_compile=false",
            "attack.norm=2",
        ],
    )
    assert loaded.attack.eps == 0.25
    assert loaded.eval.eps_sweep == [0.0, 0.1]
    assert loaded.runtime.jit_compile is False
    assert loaded.attack.norm == "2"


def test_defaults_and_round_trip():
    recipe = recipe_from_dict(GOOD)
    assert recipe.attack.method == "fgsm_rs"
    again = recipe_from_dict(yaml.safe_load(recipe.to_yaml()))
    assert again == recipe


@pytest.mark.backend_neutral
def test_runtime_backend_auto_is_the_backend_keras_runs_on():
    # The default, and the shipped recipes': the resolved recipe (a run
    # folder's recipe.yaml, which `advtrain resume` reads) names the
    # backend that ran, so a resume goes on on it.
    import keras

    from advtrain.cli.commands import RECIPES_DIR

    running = keras.backend.backend()
    auto = {**GOOD, "runtime": {"backend": "auto"}}
    for recipe in (recipe_from_dict(GOOD), recipe_from_dict(auto)):
        assert recipe.runtime.backend == running
        assert yaml.safe_load(recipe.to_yaml())["runtime"]["backend"] == running
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        runtime = yaml.safe_load(path.read_text()).get("runtime") or {}
        assert "backend" not in runtime, f"{path.name} pins runtime.backend"


def test_shipped_recipes_validate():
    from advtrain.cli.commands import RECIPES_DIR

    paths = sorted(RECIPES_DIR.glob("*.yaml"))
    # The list README and `advtrain recipes` promise, each valid and named
    # after its file.
    assert [p.stem for p in paths] == [
        "digits_transfer", "gtsrb_resnet", "mnist_fast", "mnist_fgsm_rs",
        "mnist_inception", "mnist_pgd", "mnist_pretrain", "quickstart",
    ]  # fmt: skip
    for path in paths:
        assert load_recipe(path).name == path.stem


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("attack: {eps: yes}", "'attack.eps': Input should be a valid number"),
        ("train: {batch_size: true}", "booleans, not numbers"),
        ("runtime: {steps_per_execution: true}", "'runtime.steps_per_execution'"),
        ("attack: {norm: 2.5}", "attack.norm: must be 'inf' (L-infinity) or 2"),
        ("eval: {norm: true}", "'eval.norm'"),
        ("train: {warmup_epochs: .inf}", "finite number"),
        ("attack: {eps: .nan}", "finite number"),
        ("train: {seed: 4294967296}", "'train.seed'"),
        ("name: ../../x", "no '/' or '..'"),
        ('name: "a\\0b"', "NUL"),
        ("? [a, b]\n: 1", "a key must be a plain name"),
        ("data: " + "[" * 3000 + "]" * 3000, "nested too deeply"),
        ("data: " + "[" * 20 + "]" * 20, "nested deeper than 16 levels"),
    ],
)
def test_strict_values_are_refused_by_name(tmp_path, text, fragment):
    with pytest.raises(RecipeError, match="r.yaml") as info:
        load_recipe(_write(tmp_path, "r.yaml", text))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_exact_norms_still_accept_yaml_numbers(tmp_path):
    text = "attack: {norm: 2}\neval: {norm: .inf}"
    recipe = load_recipe(_write(tmp_path, "r.yaml", text))
    assert (recipe.attack.norm, recipe.eval.norm) == ("2", "inf")


def test_a_huge_recipe_fails_without_being_read_whole(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as handle:
        handle.write("name: t\n")
        handle.seek(60_000_000)
        handle.write("\n")
    with pytest.raises(RecipeError, match="larger than 1000000 bytes"):
        load_recipe(path)
