"""The metrics log of a run directory, plain or compacted, for the tools of tools/.

A run directory holds metrics.jsonl (written by `fp4train train`) or, once `fp4train compact`
has compressed it, metrics.jsonl.zst (zstd; docs/compare.md "Compacted runs"). open_metrics
gives the lines of either as the same text stream. Decompression uses the zstandard module
(Debian: python3-zstandard), else the zstd program.
"""
import io
import os
import subprocess

PLAIN = "metrics.jsonl"
PACKED = "metrics.jsonl.zst"


class MetricsError(Exception):
    """A metrics log that cannot be read; the message names the file."""


def metrics_path(run_dir):
    """Path of the run's metrics log: RUN_DIR/metrics.jsonl, else RUN_DIR/metrics.jsonl.zst,
    else None. Raises MetricsError when both exist (as `fp4train report` refuses them)."""
    plain, packed = os.path.join(run_dir, PLAIN), os.path.join(run_dir, PACKED)
    if os.path.exists(plain) and os.path.exists(packed):
        raise MetricsError(f"{run_dir} holds both {PLAIN} and {PACKED}; run `fp4train compact "
                           f"{run_dir}` to keep the compressed copy, or remove one of them")
    if os.path.exists(packed):
        return packed
    return plain if os.path.exists(plain) else None


def zstd_bytes(path):
    """The decompressed content (bytes) of the zstd file `path` (one or more frames).
    Raises MetricsError naming the file when it is empty, corrupt or truncated."""
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise MetricsError(f"{path} is empty (no zstd frame)")
    try:
        import zstandard
    except ImportError:
        try:
            p = subprocess.run(["zstd", "-dcq", path], capture_output=True, check=False)
        except OSError:
            raise MetricsError(f"{path}: cannot decompress: neither the Python module zstandard "
                               "nor the zstd program is installed (Debian: python3-zstandard)") from None
        if p.returncode != 0:
            raise MetricsError(f"{path}: corrupt or truncated zstd data "
                               f"({p.stderr.decode(errors='replace').strip()})")
        return p.stdout
    out = []
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        try:
            out.append(d.decompress(data))
        except zstandard.ZstdError as e:
            raise MetricsError(f"{path}: corrupt zstd data ({e})") from None
        if not d.eof:
            raise MetricsError(f"{path}: truncated zstd data (the file ends inside a frame)")
        data = d.unused_data
    return b"".join(out)


def open_metrics(path):
    """A text stream (UTF-8) of the metrics log `path` (plain, or .zst decompressed), read as
    open(path, encoding="utf-8") would read the plain file."""
    if path.endswith(".zst"):
        return io.TextIOWrapper(io.BytesIO(zstd_bytes(path)), encoding="utf-8")
    return open(path, encoding="utf-8")
