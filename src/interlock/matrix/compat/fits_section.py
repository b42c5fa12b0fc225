"""The page's "What fits" section: the memory table of `interlock.matrix.fits` on the
first reference machine, in both formats."""

from __future__ import annotations

from interlock.matrix import fits
from interlock.matrix.compat.html_text import escape, inline_html
from interlock.matrix.compat.markdown_text import wrap


def _fits_caption() -> str:
    machine = fits.MACHINES[0]
    return (f"What one device holds on {machine.name}, per reference model and strategy "
            f"({fits.PRECISION}, {fits.OPTIMIZER}; `✗` where it does not fit, with what it "
            "would need): `interlock.plan(model=...)`'s own answer. The other reference "
            "machines, and what each cell counts: [memory-fits.md](memory-fits.md).")


def md_fits() -> list[str]:
    return ["## What fits", "", *wrap(_fits_caption()), "",
            *fits.markdown_table(*fits.table(fits.MACHINES[0])), ""]


def html_fits() -> list[str]:
    headers, rows = fits.table(fits.MACHINES[0])
    out = ["<h2>What fits</h2>", f"<p>{inline_html(_fits_caption())}</p>", "<table>",
           "<tr>" + "".join(f"<th>{inline_html(h)}</th>" for h in headers) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</table>")
    return out
