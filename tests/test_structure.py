"""The trainer's structure: a run's config is resolved once and handed down by section, not read again whole at
every level (docs/architecture.md, "A run's config, step by step")."""
import ast
from pathlib import Path

import pkmixer

SOURCE = Path(pkmixer.__file__).parent
# the functions that may take a whole TrainConfig: the config module's own, the entry points, the run that
# resolves it, the stacked runs' grouping key, the CLI's check before a run is made, and the sweep's specs
MOST_WHOLE_CONFIG_SIGNATURES = 10


def taking_a_whole_config(tree: ast.AST) -> list[ast.FunctionDef]:
    """The functions and methods of ``tree`` with a parameter annotated as a TrainConfig (alone, optional or in
    a list)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(a.annotation is not None and "TrainConfig" in ast.unparse(a.annotation)
                    for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs)]


def test_few_signatures_take_a_whole_config():
    found = [f"{path.relative_to(SOURCE)}:{node.lineno} {node.name}" for path in sorted(SOURCE.rglob("*.py"))
             for node in taking_a_whole_config(ast.parse(path.read_text()))]
    assert len(found) <= MOST_WHOLE_CONFIG_SIGNATURES, "\n".join(found)


def test_the_count_sees_every_form_of_the_annotation():
    tree = ast.parse("def a(cfg: TrainConfig): ...\ndef b(cfg: TrainConfig | None = None): ...\n"
                     "def c(*, cfgs: list[TrainConfig]): ...\ndef d(data: DataConfig, seed: int): ...\n"
                     "class E:\n    def f(self, cfg: 'TrainConfig'): ...\n")
    assert [node.name for node in taking_a_whole_config(tree)] == ["a", "b", "c", "f"]


# what train/ may import from models/ and layers/: creation and restoring by name, the model contract's functions
# (decay, stacking); never a model or layer class, so that a new family trains and stacks with no edit under train/
TRAIN_MAY_IMPORT = {"available_memory", "create_model", "canonical_name", "model_entry", "import_checkpoint",
                    "enlarged_options", "enlarged_state_dict", "model_from_checkpoint", "decayed_parameters",
                    "ragged_tensors", "stack_modules"}


def test_train_names_no_model_or_layer_class():
    found = []
    for path in sorted((SOURCE / "train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and (node.module or "").split(".")[0] in (
                    "models", "layers"):
                found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name not in TRAIN_MAY_IMPORT]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("pkmixer.models",
                                                                                      "pkmixer.layers")):
                found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names]
    assert not found, "train/ imports from models/ or layers/ beyond the contract:\n" + "\n".join(found)
