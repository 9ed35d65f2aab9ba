"""A plugin attack and a plugin objective, picked by name from a recipe.

    python examples/plugin_attack_and_objective.py          # seconds: 300 digits
    python examples/plugin_attack_and_objective.py --full   # 1,437 digits, 12 epochs

`examples/my_plugins.py` registers the attack `fgsm_jitter` and the
objective `confidence_penalty`. This script writes a recipe that names
them (its `plugins` key imports the module) and runs it with
`advtrain.load_recipe` and `advtrain.run`, as `advtrain run plugins.yaml`
would; the run folder is `runs/plugins` under the current folder.

Runs on: TensorFlow (the plugins in `my_plugins.py` use `tf` ops).
"""

import argparse
import shutil
import sys
from pathlib import Path

import yaml

import advtrain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="real sizes")
args = parser.parse_args()

recipe = {
    "name": "plugins",
    # Imported before the rest of the recipe is checked, so the names below
    # exist. Found on sys.path: here the script's folder, examples/ (for
    # `advtrain run`, the current folder).
    "plugins": ["my_plugins"],
    "data": {"source": "digits", "limit_train": None if args.full else 300},
    "model": {"backbone": "small_cnn", "width": 32 if args.full else 16},
    "attack": {
        "method": "fgsm_jitter",
        "eps": 0.1,
        "options": {"jitter": 0.25},  # the attack's own setting
        "adv_weight": 0.5,
        "objective": "confidence_penalty",
        "objective_options": {"beta": 0.2},
    },
    "train": {
        "epochs": 12 if args.full else 3,
        "batch_size": 64,
        "learning_rate": 0.003,
    },
    "eval": {"eps": 0.1, "budget": "cheap", "sanity_examples": 0},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}
if not args.full:
    recipe["eval"].update(
        pgd_steps=5, max_examples=100, apgd_steps=10, square_queries=100
    )
Path("plugins.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))

run_dir = Path("runs/plugins")
shutil.rmtree(run_dir, ignore_errors=True)  # a finished run folder is not rerun
result = advtrain.run(advtrain.load_recipe("plugins.yaml"), run_dir, echo=print)

# What the plugins recorded: the recipe's settings reached them.
plugins = sys.modules["my_plugins"]
for line in dict.fromkeys(plugins.CALLS):  # once each, in order
    print(f"plugin: {line}")
print(
    f"robust accuracy {result.metrics['robust_accuracy']:.1%} "
    f"(clean {result.metrics['clean_accuracy']:.1%}); run folder {run_dir}"
)
