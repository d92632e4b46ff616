"""Maps the source folders onto the installed import names: core/ -> ninfer, plugins/ -> ninfer_plugins.

Nothing named `core` or `plugins` lands in site-packages.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {"ninfer": "core", "ninfer_plugins": "plugins"}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages, dirs = [], {}
    for name, folder in ROOTS.items():
        for init in sorted(Path(folder).rglob("__init__.py")):
            rel = init.parent.relative_to(folder).parts
            pkg = ".".join((name, *rel))
            packages.append(pkg)
            dirs[pkg] = init.parent.as_posix()
    return packages, dirs


packages, package_dir = _packages()
setup(packages=packages, package_dir=package_dir)
