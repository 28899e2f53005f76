"""A Griffe extension (mkdocs.yml: mkdocstrings' `extensions`) that loads the modules of a folder of aha that has no
`__init__.py` (aha/train is a namespace package inside a regular one, which Griffe skips on purpose), so the API
reference documents them under their import names (`aha.train.grpo`). Without such folders it does nothing."""

from __future__ import annotations

from pathlib import Path

import griffe


class NamespaceFolders(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "aha" or pkg.filepath is None:
            return
        root = Path(str(pkg.filepath)).parent
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not (p / "__init__.py").exists()):
            files = sorted(f for f in folder.glob("*.py") if not f.name.startswith("_"))
            if not files or folder.name in pkg.members:
                continue
            space = griffe.Module(folder.name, filepath=[folder], parent=pkg)
            pkg.set_member(folder.name, space)
            for file in files:
                code = file.read_text()
                module = griffe.visit(file.stem, file, code, extensions=loader.extensions, parent=space,
                                      docstring_parser=loader.docstring_parser,
                                      docstring_options=loader.docstring_options,
                                      lines_collection=loader.lines_collection,
                                      modules_collection=loader.modules_collection)
                space.set_member(file.stem, module)
