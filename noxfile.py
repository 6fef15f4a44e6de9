"""Developer sessions: lint, the full test suite, and each plugin installed alone with core."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests", "docs"]
nox.options.default_venv_backend = "venv"

PLUGINS = ["loong_llm", "loong_vlm", "loong_diffusion", "loong_embodied", "loong_kernels", "loong_xpu"]
EXTRAS = {"loong_llm": "[data]", "loong_embodied": "[sim,vla]"}
# Plugins built on another plugin (installed first in the isolated session).
REQUIRES = {"loong_vlm": ["loong_llm"]}
TORCH = "torch==2.13.0"


@nox.session
def lint(session):
    """ruff over every package."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def docs(session):
    """The docs site (mkdocs, strict: a broken link or an undocumented hook fails it) into site/."""
    session.install("mkdocs>=1.6")
    session.install("-e", "loong_core")
    session.run("python", "-m", "mkdocs", "build", "--strict", *session.posargs)


@nox.session
def tests(session):
    """All packages installed together; the whole suite."""
    session.install(TORCH)
    session.install("-r", "requirements-dev.txt")
    session.install("-e", "loong_core", *[arg for p in PLUGINS for arg in ("-e", p + EXTRAS.get(p, ""))])
    session.run("pytest", *session.posargs)


@nox.session
@nox.parametrize("package", ["loong_core", *PLUGINS])
def isolated(session, package):
    """One package (plus core) in a fresh environment must pass its own tests."""
    session.install(TORCH)
    session.install("-r", "requirements-dev.txt")
    session.install("-e", "loong_core")
    if package != "loong_core":
        for required in REQUIRES.get(package, []):
            session.install("-e", required)
        session.install("-e", package + EXTRAS.get(package, ""))
    session.run("pytest", f"{package}/tests", *session.posargs)


@nox.session
def lerobot(session):
    """The policies against LeRobot 0.4.4: builds its reference venv (tools/build_lerobot_venv.py; cached,
    about 8 GiB and 3-4 minutes the first time) and runs the tests marked ``lerobot``. Not in CI's run."""
    session.install(TORCH)
    session.install("-r", "requirements-dev.txt")
    session.install("-e", "loong_core", "-e", "loong_embodied[vla]")
    session.run("python", "tools/build_lerobot_venv.py")
    session.run("pytest", "-m", "lerobot", "-rs", "loong_embodied/tests", *session.posargs)
