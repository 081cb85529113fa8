"""``make bundle``: the self-contained runtime, a relocatable one-folder PyInstaller bundle, as a tar.gz.

Usage: ``python scripts/build_bundle.py [--cache DIR] [--dist DIR]`` (run by the project venv's Python, which
must have PyInstaller: ``scripts/bootstrap.sh`` installs it with the test extra). Prints the archive's path
on stdout, one line; on stderr, one line before a build saying what it does and how long it takes, and one
after with the archive's sha256, which it also writes beside the archive as ``<archive>.sha256``
(``sha256sum -c`` format; ``ignition --runtime-sha256`` takes it). PyInstaller's warnings go to stderr.
Exit 0 built (or found in the cache), 1 the build failed, 2 bad usage.

Layout of the archive (one top directory, so it unpacks anywhere; nothing in it names where it was built):

    upgrade-core-runtime/upgrade-agent            the frozen program (PyInstaller's bootloader)
    upgrade-core-runtime/recover-agent-upgrade    -> upgrade-agent (relative symlink)
    upgrade-core-runtime/agent-upgrade            -> upgrade-agent (relative symlink)
    upgrade-core-runtime/_internal/...            the interpreter, the standard library, the dependencies
    upgrade-core-runtime/share/...                the man page and bash/zsh completions (scripts/cli_docs.py)

One executable dispatching on ``argv[0]`` (:mod:`agent.cli.frozen`) rather than three bundles or a MERGE of
three: one copy of the interpreter and libraries, and ``recover-agent-upgrade`` sits beside
``sys.executable`` where :func:`agent.session.wiring.recover_executable` looks for it.

The build is cached under ``--cache`` (default ``.cache/bundle``) by a digest of what goes into it: the
package sources, ``pyproject.toml``, this script, the Python version and the PyInstaller version; an
unchanged tree costs one hash of the sources. ``kubernetes_asyncio`` is left out (only the Kubernetes source
of ``[operations]`` uses it, through a lazy import that a frozen program cannot serve); with
``source = "kubernetes"`` the bundle fails with one line naming the missing package.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "upgrade_core", "journal")
TOP = "upgrade-core-runtime"
ALIASES = ("recover-agent-upgrade", "agent-upgrade")
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def project_version() -> str:
    """The ``[project] version`` of ``pyproject.toml``."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def arch() -> str:
    """``amd64`` or ``arm64`` (the names design §3 uses for ``{arch}``); the machine name otherwise."""
    machine = platform.machine().lower()
    return _ARCH.get(machine, machine)


def archive_name() -> str:
    """``upgrade-core-runtime-<version>-linux-<arch>.tar.gz``."""
    return f"upgrade-core-runtime-{project_version()}-linux-{arch()}.tar.gz"


def source_digest() -> str:
    """sha256 (hex) over every input of the build: package files, pyproject.toml, this script, the
    Python and PyInstaller versions."""
    import PyInstaller

    h = hashlib.sha256()
    h.update(f"{sys.version}\0{PyInstaller.__version__}\0".encode())
    files = [ROOT / "pyproject.toml", Path(__file__).resolve(), ROOT / "scripts" / "cli_docs.py"]
    for package in PACKAGES:
        files += [p for p in (ROOT / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _freeze(work: Path) -> Path:
    """Run PyInstaller into ``work``; returns the one-folder bundle directory."""
    argv = [
        sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--onedir", "--log-level", "WARN",
        "--name", "upgrade-agent",
        "--distpath", str(work / "dist"), "--workpath", str(work / "build"), "--specpath", str(work),
        "--paths", str(ROOT),
        # `upgrade-agent --version` reads the distribution's version from its metadata
        "--copy-metadata", "upgrade-core",
        *[a for package in PACKAGES for a in ("--collect-submodules", package)],
        # the sample agent and the boot scripts the harness ships as package data
        "--collect-data", "agent",
        "--exclude-module", "kubernetes_asyncio",
        # test-only packages some dependencies import when present
        *[a for module in ("tkinter", "hypothesis", "pytest", "_pytest", "pluggy", "trio", "outcome")
          for a in ("--exclude-module", module)],
        # nothing here needs setuptools at run time; bundled, its runtime hook imports pkg_resources (and its
        # vendored packages) at every start, about doubling the start-up time of a no-op recovery
        "--exclude-module", "setuptools", "--exclude-module", "pkg_resources",
        # Start-up cost (design §9 ``recover.noop.bundle``): every module left in the archive is an entry of
        # its table of contents, which the frozen program reads at each start (about 25,000 instructions
        # an entry); a collected package also brings its PyInstaller runtime hook, run at each start.
        # Collected through the standard library's graph, used by nothing here, each with a runtime hook
        # that imports it (multiprocessing loads pickle, socket, selectors and subprocess with it):
        "--exclude-module", "multiprocessing", "--exclude-module", "pkgutil",
        # optional parts of dependencies that nothing here uses: httpx's own command-line tool (the only
        # user of click: without click, importing httpx skips it and the rich.syntax and pygments it loads),
        # rich's syntax highlighting and Markdown (pygments, markdown_it; the progress display uses
        # neither), HTTP/2 (h2 and its parts; the agent's clients speak HTTP/1.1), truststore's urllib3
        # injection (urllib3):
        *[a for module in ("click", "pygments", "markdown_it", "mdurl", "linkify_it", "h2", "hpack",
                           "hyperframe", "urllib3") for a in ("--exclude-module", module)],
        str(ROOT / "agent" / "cli" / "frozen.py"),
    ]
    subprocess.run(argv, check=True, cwd=work, stdout=sys.stderr)
    bundle = work / "dist" / "upgrade-agent"
    for alias in ALIASES:
        os.symlink("upgrade-agent", bundle / alias)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_docs.py"), str(bundle)], check=True,
                   stdout=subprocess.DEVNULL)
    return bundle


def _pack(bundle: Path, archive: Path) -> None:
    """Pack ``bundle`` as ``TOP/`` into a gzip tar at ``archive`` (written beside it, then renamed)."""
    partial = archive.with_name(archive.name + ".partial")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname=TOP, filter=clean)
    os.replace(partial, archive)


def build(cache: Path) -> Path:
    """The runtime archive for the current sources, from ``cache`` when it is there, else built into it.

    Args:
        cache: directory of cached builds, one subdirectory per source digest.

    Returns:
        The archive's path (``cache/<digest>/upgrade-core-runtime-<version>-linux-<arch>.tar.gz``).

    Raises:
        subprocess.CalledProcessError: PyInstaller failed (its output went to stderr).
    """
    slot = cache / source_digest()
    archive = slot / archive_name()
    if archive.is_file():
        return archive
    work = slot / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print("build_bundle: freezing the runtime with PyInstaller (a minute or two on 2 cores; cached "
          "afterwards until the sources change)", file=sys.stderr, flush=True)
    _pack(_freeze(work), archive)
    shutil.rmtree(work, ignore_errors=True)
    for other in cache.iterdir():  # keep only the current build: each one is ~40 MB
        if other != slot and other.is_dir() and len(other.name) == 64:
            shutil.rmtree(other, ignore_errors=True)
    return archive


def main(argv: list[str]) -> int:
    """Build (or find in the cache) the runtime archive; copy it into ``--dist`` when given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "bundle")
    parser.add_argument("--dist", type=Path, help="also copy the archive into this directory")
    args = parser.parse_args(argv)
    try:
        archive = build(args.cache.resolve())
    except subprocess.CalledProcessError as exc:
        print(f"build_bundle: PyInstaller failed (exit {exc.returncode}); see its output above",
              file=sys.stderr)
        return 1
    if args.dist:
        args.dist.mkdir(parents=True, exist_ok=True)
        shutil.copy2(archive, args.dist / archive.name)
        archive = args.dist / archive.name
    digest = write_sha256(archive)
    print(f"build_bundle: sha256 {digest}  (written to {archive.name}.sha256)", file=sys.stderr)
    print(archive)
    return 0


def write_sha256(archive: Path) -> str:
    """Hash ``archive`` and write ``<archive>.sha256`` beside it (``HEX  NAME``, as ``sha256sum`` prints);
    returns the hex digest."""
    h = hashlib.sha256()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    archive.with_name(archive.name + ".sha256").write_text(f"{digest}  {archive.name}\n")
    return digest


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
