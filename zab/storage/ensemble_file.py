"""The committed ensemble a node persisted (ZooKeeper's zoo.cfg.dynamic): `<data_dir>/ensemble`.

Written (atomically: tmp, fsync, rename) whenever a reconfig commits or a leader tells this
node of a newer ensemble; read at start, where it replaces cluster.toml's members, which are
only the bootstrap. Its text is what /zookeeper/config shows: server lines, then
`version=<hex zxid>`. Losing the newest write to a crash is safe: the reconfig transaction
is in the log, so the node treats it as pending (both quorums) until a leader commits it again.
"""

from __future__ import annotations

from pathlib import Path

from edge.files import write_atomically
from zab.core.ensemble import Ensemble, EnsembleError, parse_spec
from zab.storage.storage_errors import StorageError

ENSEMBLE_FILE = "ensemble"


class EnsembleFileError(StorageError):
    """The persisted ensemble cannot be read; the message names the file."""


def write_ensemble(data_dir: Path, ensemble: Ensemble) -> None:
    write_atomically(Path(data_dir) / ENSEMBLE_FILE, [ensemble.config_data() + b"\n"])


def read_ensemble(data_dir: Path) -> Ensemble | None:
    """The persisted ensemble, None if this node never had one but the bootstrap."""
    path = Path(data_dir) / ENSEMBLE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise EnsembleFileError(f"{path}: {e}") from None
    versions = [line.strip()[len("version="):] for line in text.splitlines() if line.strip().startswith("version=")]
    try:
        if len(versions) != 1:
            raise EnsembleError("expected one version= line")
        return parse_spec(text, int(versions[0], 16))
    except (EnsembleError, ValueError) as e:
        raise EnsembleFileError(f"{path}: not an ensemble ({e}); restore it from another node's copy") from None
