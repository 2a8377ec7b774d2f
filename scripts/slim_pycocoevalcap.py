"""pycocoevalcap's wheel without its Java (METEOR, SPICE, the PTB tokenizer's jar), for a GPU node with no network.

Run:  python scripts/slim_pycocoevalcap.py pycocoevalcap-1.2-py3-none-any.whl OUTDIR

pycocoevalcap's wheel is 100 MB, nearly all of it Java, which the GPU node lacks: SPICE (its jars; the project does
not report SPICE), METEOR (its jar and its 62 MB paraphrase table; the check's tests score with ``meteor=False``)
and the PTB tokenizer's CoreNLP jar (5.6 MB). What the check runs is kept: the BLEU, ROUGE-L and CIDEr-D scorers
(plain Python) and the tokenizer's Python. Without the jar `tokenizer: auto` picks nltk's Treebank tokenizer even
where Java is present, and "ptb" names the missing jar (captioner/evaluation/metrics.py); METEOR, asked for where
Java is present, fails to start and is reported as None with a warning, as a failed METEOR is everywhere.

The copy's version gets the local label ``+slim`` (1.2 -> 1.2+slim), so that `pip list` on the node says which one
is installed; RECORD is written afresh for the files kept.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import re
import sys
import zipfile
from pathlib import Path

DROPPED = ("pycocoevalcap/spice/*.jar", "pycocoevalcap/spice/lib/*", "pycocoevalcap/meteor/*.jar",
           "pycocoevalcap/meteor/data/*", "pycocoevalcap/tokenizer/*.jar")
LABEL = "slim"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def slim_wheel(wheel: Path, out_dir: Path) -> Path:
    """Write ``wheel`` without the DROPPED files into ``out_dir`` as version ``<version>+slim``; returns its path."""
    name, version, tags = re.fullmatch(r"([^-]+)-([^-]+)-(.+)\.whl", wheel.name).groups()
    new_version = f"{version}.{LABEL}" if "+" in version else f"{version}+{LABEL}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{new_version}-{tags}.whl"
    record: list[str] = []
    dropped, dropped_bytes = 0, 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.is_dir():
                continue
            if any(fnmatch.fnmatch(info.filename, pattern) for pattern in DROPPED):
                dropped, dropped_bytes = dropped + 1, dropped_bytes + info.file_size
                continue
            path, data = info.filename, src.read(info)
            if path.startswith(old_info):
                path = new_info + path[len(old_info):]
                if path == new_info + "RECORD":
                    continue  # written below, for the files kept
                if path == new_info + "METADATA":
                    data, n = re.subn(rb"^Version: .*$", f"Version: {new_version}".encode(), data, count=1,
                                      flags=re.M)
                    if n != 1:
                        raise ValueError(f"{wheel.name}: METADATA has no Version line")
            entry = zipfile.ZipInfo(path, date_time=info.date_time)
            entry.external_attr = info.external_attr  # the file modes
            dst.writestr(entry, data, zipfile.ZIP_DEFLATED)
            record.append(f"{path},{_record_hash(data)},{len(data)}")
        record.append(f"{new_info}RECORD,,")
        dst.writestr(zipfile.ZipInfo(new_info + "RECORD", date_time=(1980, 1, 1, 0, 0, 0)),
                     "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)
    if not dropped:
        target.unlink()
        raise ValueError(f"{wheel.name}: none of {DROPPED} found; is this pycocoevalcap's wheel?")
    print(f"{target.name}: {len(record) - 1} files kept, {dropped} dropped ({dropped_bytes / 2**20:.1f} MiB), "
          f"{target.stat().st_size / 2**20:.1f} MiB", file=sys.stderr)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    slim_wheel(args.wheel, args.out_dir)


if __name__ == "__main__":
    main()
