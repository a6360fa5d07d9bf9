"""The on-disk model cache: model directories built on first use under
``$MLXCEL_HOME/models/`` (default ``~/.cache/mlxcel``) and checked on every use.

Every cached directory carries ``manifest.json`` with the sha256 of each file
and the key it was built from (a spec, a source file's digest); a directory
whose files or key do not match is rebuilt. Directories are built in a
temporary folder beside the target and renamed into place, so a reader never
sees a partial one, concurrent builders never clash, and a failed build leaves
nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"


class ModelCacheError(RuntimeError):
    """A cached model directory cannot be built; the message says why."""


def mlxcel_home(home: Path | None = None) -> Path:
    """The cache root: ``home``, else ``$MLXCEL_HOME``, else ``~/.cache/mlxcel``."""
    if home is not None:
        return Path(home)
    return Path(os.environ.get("MLXCEL_HOME", "~/.cache/mlxcel")).expanduser()


def cached_dir(dirname: str, key: dict, build: Callable[[Path], None], home: Path | None = None) -> Path:
    """``$MLXCEL_HOME/models/<dirname>`` as ``build(folder)`` writes it for ``key``,
    (re)built unless intact. ``build`` fills an empty folder; the manifest is added here."""
    target = mlxcel_home(home) / "models" / dirname
    if is_intact(target, key):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{dirname}.staging-", dir=target.parent))
    except OSError as err:
        raise ModelCacheError(f"cannot write the model cache {target.parent}: {err.strerror or err} "
                              "(set MLXCEL_HOME to a writable folder)") from err
    try:
        build(staged)
        write_manifest(staged, key)
        _move_into_place(staged, target, key)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already when the rename won
    return target


def write_manifest(path: Path, key: dict) -> None:
    files = {p.name: sha256(p) for p in sorted(Path(path).iterdir()) if p.name != MANIFEST}
    write_json(Path(path) / MANIFEST, {"spec": key, "files": files})


def is_intact(path: Path, key: dict) -> bool:
    """True when ``path`` holds exactly the files its manifest lists, unchanged, built for ``key``."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        present = {p.name for p in path.iterdir()} - {MANIFEST}
    except (OSError, ValueError):
        return False
    files = manifest.get("files", {})
    if manifest.get("spec") != key or not files or set(files) != present:
        return False
    try:
        return all(sha256(path / name) == digest for name, digest in files.items())
    except OSError:
        return False


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _move_into_place(staged: Path, target: Path, key: dict) -> None:
    """Rename ``staged`` to ``target``, replacing a damaged ``target``.

    A concurrent builder may install an intact copy first; that copy wins.
    """
    if target.exists() and not is_intact(target, key):
        _remove_aside(target)
    try:
        os.rename(staged, target)
    except OSError:
        if not is_intact(target, key):
            raise


def _remove_aside(path: Path) -> None:
    """Rename ``path`` out of the way first so no reader sees it half deleted."""
    aside = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process moved it already
    shutil.rmtree(aside, ignore_errors=True)
