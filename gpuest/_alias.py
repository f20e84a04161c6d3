"""Old import names kept for one release: `estimator.X` and `calibration.X` resolve to the module of
`gpuest` that now holds X, the same module object (isinstance and monkeypatching see one module)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.target_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The target module already ran when create_module imported it; the import system has since set
        the alias's spec on it, which would hide that the target is a package (importlib.resources)."""
        module.__spec__ = self.target_spec

    def get_code(self, fullname: str) -> CodeType | None:
        # `python3 -m calibration.runner` runs the target's code as __main__ (runpy asks for it).
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target) if spec and spec.loader else None


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, old: str, new: str, moved: dict[str, str]) -> None:
        self.old, self.new, self.moved = old, new, moved

    def target(self, fullname: str) -> str:
        for old, new in sorted(self.moved.items(), key=lambda kv: -len(kv[0])):
            if fullname == old or fullname.startswith(old + "."):
                return new + fullname[len(old):]
        return self.new + fullname[len(self.old):]

    def find_spec(self, fullname: str, path: object = None, target: object = None) \
            -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.old + "."):
            return None
        name = self.target(fullname)
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(name))


def install_alias(old: str, new: str, moved: dict[str, str] | None = None) -> None:
    """Make `old.X` import `new.X` (or `moved[old.X]`), warning once that `old` is deprecated."""
    warnings.warn(f"the `{old}` package is deprecated: import `{new}` instead (it goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    if not any(isinstance(f, _AliasFinder) and f.old == old for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(old, new, moved or {}))
