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
