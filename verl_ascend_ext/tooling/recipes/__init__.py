"""Recipes shipped inside the package: one folder per recipe (run.sh, manifest.toml, README.md).

They live in the package, not only in the source tree, so `verl-ascend recipe ...` and the run
scripts work the same from a wheel, a non-editable install and a checkout (where the top-level
``recipes/`` folder links here). Nothing here imports Hydra, OmegaConf or verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SCRIPT = "run.sh"
MANIFEST = "manifest.toml"
README = "README.md"


class UnknownRecipeError(LookupError):
    """No recipe of that name is shipped."""


@dataclass(frozen=True)
class Recipe:
    name: str
    directory: Path

    @property
    def script(self) -> Path:
        return self.directory / SCRIPT

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST

    @property
    def readme(self) -> Path:
        return self.directory / README


def list_recipes() -> list[Recipe]:
    """Every shipped recipe (a sub-folder holding a run script and a manifest), sorted by name."""
    return [Recipe(d.name, d) for d in sorted(ROOT.iterdir())
            if d.is_dir() and (d / SCRIPT).is_file() and (d / MANIFEST).is_file()]


def get_recipe(name: str) -> Recipe:
    for recipe in list_recipes():
        if recipe.name == name:
            return recipe
    known = ", ".join(r.name for r in list_recipes()) or "(none)"
    raise UnknownRecipeError(f"no recipe named {name!r}; shipped recipes: {known} (see `verl-ascend recipe list`)")
