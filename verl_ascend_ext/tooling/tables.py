"""Plain-text tables for the CLI reports (doctor, status)."""

from __future__ import annotations


def table(rows: list[list[str]], header: list[str]) -> str:
    """``rows`` under ``header``, columns left-aligned to their widest cell."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
