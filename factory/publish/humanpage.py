"""The index's human page (index.html at its root), a pure function of the build matrix's cells: an install
selector above the matrix as a grid.

The page is static: no server, no external script, font or style, so it works from a directory, S3 or
`factory serve` alike. Everything the selector knows is in the grid itself, and the grid is a plain table
that reads without JavaScript:
- each row is a variant of a project on one platform (one variant index lists every platform's wheels,
  the wheel's platform tag tells pip which to take), its `data-*` attributes what the variant id says
  (CUDA, torch, C++ ABI, archs; parsed here, by `factory.core.variants`, never by the script) and its
  platform, and its last cell the pip and uv commands `factory.publish.installcmd` composes for it: pinned
  to the newest release built for that platform, so a row's commands install its platform's wheel. The
  script only picks a row and shows its commands (with the page's own URL completing the relative index
  URL), so the command format has one owner.
- each built cell carries its wheel's machine, the end of its filename (the row carries the shared start,
  which keeps the page small: under 100 KB for a 300-job matrix) and which files are published beside it
  (`index.BESIDE`); the script turns them into links to the wheel, its provenance, SBOM, signature and
  build record.
- the GPU picker's names and the driver's CUDA choices come from `factory.core.gpus` (`GPUS`,
  `DRIVER_CUDA`).
When no row fits, the script says what is missing and prints the matrix lines that would build it, in
`variantrequest.matrix_lines`' format (a browser test checks both give the same lines): for the platform
picked, named where it is not the default one (which an include entry without a platform builds). The
platform picker offers every platform the factory builds, those without a wheel yet too.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from factory.core import gpus
from factory.core.platforms import BUILDABLE, DEFAULT_PLATFORM
from factory.core.tags import parse_manylinux
from factory.core.variants import VariantKey, version_tuple
from factory.publish import installcmd
from factory.publish.index import BESIDE, MatrixCell

_CPYTHON = re.compile(r"\d+\.\d+")
_DEFAULT = DEFAULT_PLATFORM.name
# The one-letter spelling of index.BESIDE's names in a cell's data-s, and each link's text.
_BESIDE_LETTERS = {
    "provenance": ("p", "provenance"),
    "sbom": ("c", "SBOM"),  # CycloneDX
    "signature": ("s", "signature"),
    "build-record": ("b", "build"),
}


def _python_key(python: str) -> tuple[int, ...] | tuple[int, str]:
    try:
        return tuple(int(p) for p in python.split("."))
    except ValueError:
        return (-1, python)


def _key(variant_id: str) -> VariantKey | None:
    try:
        return VariantKey.parse_id(variant_id)
    except ValueError:
        return None


def _machine(filename: str) -> str | None:
    """The machine a wheel runs on (a `factory.core.platforms` name; "any" for a pure wheel); None for no
    wheel
    filename."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except InvalidWheelFilename:
        return None
    machines = set()
    for tag in tags:
        many = parse_manylinux(tag.platform)
        if many is not None:
            machines.add(many.machine)
        elif tag.platform.startswith("linux_"):
            machines.add(tag.platform.removeprefix("linux_"))
        elif tag.platform == "any":
            machines.add("any")
    return sorted(machines)[0] if len(machines) == 1 else None


def _install_cell(project: str, variant_id: str, built: Sequence[str]) -> str:
    """The pip and uv commands of a variant's row: its project pinned to the newest release built (the
    wheel filenames of its built cells) from the variant index alone (`installcmd.variant_install`); none
    where nothing is built."""
    version = installcmd.newest_release(built)
    variant_index = f"simple/{variant_id}/"
    install = None
    if version is not None:
        install = installcmd.variant_install(
            project, version=version, variant_id=variant_id, variant_index=variant_index
        )
    if install is None:
        return ""
    codes = "<br>".join(
        f'<code data-index="{html.escape(variant_index)}">{html.escape(command)}</code>'
        for command in installcmd.commands(install)
    )
    return f"<details><summary>pip, uv</summary>{codes}</details>"


@dataclass(frozen=True)
class _Shared:
    """What a row's built cells share, written once on the row to keep the page small: the start and the end
    of their filenames (character by character) and their machine."""

    prefix: str = ""
    suffix: str = ""
    machine: str | None = None

    @classmethod
    def of(cls, filenames: Sequence[str]) -> _Shared:
        machines = {_machine(f) for f in filenames}
        machine = machines.pop() if len(machines) == 1 else None
        if len(filenames) < 2:
            return cls(machine=machine)
        prefix = os.path.commonprefix(list(filenames))  # noqa: RUF071 (not paths)
        ends = os.path.commonprefix([f[::-1] for f in filenames])[::-1]  # noqa: RUF071
        room = min(len(f) for f in filenames) - len(prefix)
        return cls(
            prefix=prefix, suffix=ends[len(ends) - room :] if len(ends) > room else ends, machine=machine
        )

    def rest(self, filename: str) -> str:
        return filename[len(self.prefix) : len(filename) - len(self.suffix)]


def _row_attrs(variant_id: str, key: VariantKey | None, shared: _Shared, platform: str) -> str:
    attrs = {
        "data-w": f"files/{quote(variant_id, safe='')}/{quote(shared.prefix, safe='')}",
        "data-x": quote(shared.suffix, safe=""),
        "data-m": shared.machine or platform,
    }
    if key is not None:
        attrs |= {
            "data-cu": key.cuda,
            "data-t": key.torch,
            "data-abi": str(int(key.cxx11_abi)),
            "data-a": " ".join(key.archs),
        }
        if key.stable:
            attrs["data-st"] = ""
    return "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())


def _cell(got: MatrixCell | None, shared: _Shared) -> str:
    if got is None:
        return '<td class="not-built">not built</td>'
    if got.status == "failed":
        reason = html.escape(got.detail or "no reason given")
        # the index's own key (publish wrote it, cells_from_json checked its shape), relative to the page
        link = f' <a href="{html.escape(quote(got.record))}">build record</a>' if got.record else ""
        return f'<td class="failed">failed: {reason}{link}</td>'
    if got.status != "built":
        title = f' title="{html.escape(got.detail)}"' if got.detail else ""
        return f'<td class="not-built"{title}>not built</td>'
    attrs = f' data-f="{html.escape(quote(shared.rest(got.detail), safe=""))}"'
    machine = _machine(got.detail)
    if machine is not None and shared.machine is None:
        attrs += f' data-m="{html.escape(machine)}"'
    letters = "".join(_BESIDE_LETTERS[name][0] for name in got.beside if name in _BESIDE_LETTERS)
    if letters:
        attrs += f' data-s="{letters}"'
    when = f" {html.escape(got.published[:10])}" if got.published else ""
    return f'<td class="built"{attrs}>built{when}</td>'


def _grid(project: str, pcells: Sequence[MatrixCell]) -> list[str]:
    pythons = sorted({c.python for c in pcells}, key=_python_key)
    # a variant's rows, one per platform: the default platform's first
    rows = sorted({(c.variant_id, c.platform) for c in pcells}, key=lambda r: (r[0], r[1] != _DEFAULT, r[1]))
    grid = {(c.variant_id, c.platform, c.python): c for c in pcells}
    head = "".join(f"<th>{html.escape(p)}</th>" for p in pythons)
    lines = [
        f"<h3>{html.escape(project)}</h3>",
        f'<table data-p="{html.escape(project)}">',
        f"  <tr><th>variant</th><th>platform</th>{head}<th>install</th></tr>",
    ]
    for vid, platform in rows:
        built = [
            c.detail for c in pcells if (c.variant_id, c.platform) == (vid, platform) and c.status == "built"
        ]
        shared = _Shared.of(built)
        tds = "".join(_cell(grid.get((vid, platform, py)), shared) for py in pythons)
        install = _install_cell(project, vid, built)
        row = _row_attrs(vid, _key(vid), shared, platform)
        # a pure wheel's row serves every platform
        shown = html.escape(shared.machine if shared.machine == "any" else platform)
        lines.append(f"  <tr{row}><td>{html.escape(vid)}</td><td>{shown}</td>{tds}<td>{install}</td></tr>")
    lines.append("</table>")
    return lines


def _options(values: Iterable[tuple[str, str]], *, anything: str | None = "any") -> str:
    first = [] if anything is None else [f'<option value="">{html.escape(anything)}</option>']
    return "".join(
        first + [f'<option value="{html.escape(v)}">{html.escape(label)}</option>' for v, label in values]
    )


def _selector(cells: Sequence[MatrixCell]) -> list[str]:
    """The picker's form: its choices are the values the grid has (and the driver's CUDA releases)."""
    keys = [k for k in (_key(v) for v in {c.variant_id for c in cells}) if k is not None]
    projects = sorted({c.project for c in cells})
    cudas = sorted({k.cuda for k in keys}, key=version_tuple, reverse=True)
    torches = sorted({k.torch for k in keys}, key=version_tuple, reverse=True)
    pythons = sorted({c.python for c in cells if _CPYTHON.fullmatch(c.python)}, key=_python_key, reverse=True)
    # every platform the factory builds, a wheel or not: a host of one that has none yet is told so, and gets
    # the matrix lines (and `factory which --request`'s request) for its own platform
    machines = sorted(
        {m for c in cells if c.status == "built" for m in [_machine(c.detail)] if m and m != "any"}
        | {p.name for p in BUILDABLE}
    )
    abis = sorted({str(int(k.cxx11_abi)) for k in keys}, reverse=True)
    low = min((version_tuple(c)[0] for c in cudas), default=12)
    drivers = [cuda for _version, cuda in gpus.DRIVER_CUDA if version_tuple(cuda)[0] >= low - 1]
    cuda_options = (
        '<option value="">any</option><optgroup label="torch\'s CUDA (torch.version.cuda)">'
        + "".join(f'<option value="t:{html.escape(c)}">{html.escape(c)}</option>' for c in cudas)
        + '</optgroup><optgroup label="the driver\'s CUDA (nvidia-smi, no torch yet)">'
        + "".join(f'<option value="d:{html.escape(c)}">driver {html.escape(c)}</option>' for c in drivers)
        + "</optgroup>"
    )
    gpu_names = "".join(f'<option value="{html.escape(n)}" label="{html.escape(cc)}">' for n, cc in gpus.GPUS)

    def field(label: str, control: str, *, hidden: bool = False) -> str:
        return f"<label{' hidden' if hidden else ''}><span>{label}</span>{control}</label>"

    return [
        '<form id="pick" hidden>',
        field(
            "Project",
            f'<select id="project">{_options(((p, p) for p in projects), anything=None)}</select>',
            hidden=len(projects) < 2,
        ),
        field("Platform", f'<select id="platform">{_options((m, f"Linux {m}") for m in machines)}</select>'),
        field("CUDA", f'<select id="cuda">{cuda_options}</select>'),
        field("torch", f'<select id="torch">{_options((t, t) for t in torches)}</select>'),
        field("Python", f'<select id="python">{_options((p, p) for p in pythons)}</select>'),
        field("GPU", '<input id="gpu" list="gpus" placeholder="H100, RTX 5090 or 9.0" autocomplete="off">'),
        field(
            "C++ ABI",
            f'<select id="abi">{_options((a, f"cxx11 ABI {a}") for a in abis)}</select>',
            hidden=len(abis) < 2,
        ),
        f'<datalist id="gpus">{gpu_names}</datalist>',
        "</form>",
        '<div id="answer" hidden><p id="verdict"></p><ul id="notes"></ul>'
        '<div id="commands"><h4>pip</h4><pre id="pip"></pre><h4>uv</h4><pre id="uv"></pre></div>'
        '<div id="missing"><p>A matrix with these lines would build it '
        '(or run <code>factory which --request</code> on the machine):</p><pre id="lines"></pre></div></div>',
    ]


_STYLE = (
    ":root{--fg:#1d232b;--mute:#5b6673;--line:#d9dee4;--ok:#dff5e3;--bad:#fbe0e0;--no:#f1f3f5;--acc:#3b5bdb}"
    "[hidden]{display:none!important}"
    "body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--fg);margin:0;"
    "background:#f7f8fa}main{max-width:72em;margin:0 auto;padding:1.5em 2em}h1{margin:.2em 0}"
    "p.lead{color:var(--mute);margin-top:0}"
    "#pick{display:grid;grid-template-columns:repeat(auto-fit,minmax(10em,1fr));gap:.8em;background:#fff;"
    "border:1px solid var(--line);border-radius:10px;padding:1em 1.2em}#pick label span{display:block;"
    "font-size:.8em;font-weight:600;color:var(--mute);text-transform:uppercase;letter-spacing:.04em;"
    "margin-bottom:.2em}#pick select,#pick input{width:100%;box-sizing:border-box;"
    "font:inherit;padding:.35em .4em;border:1px solid var(--line);border-radius:6px;background:#fff}"
    "#answer{background:#fff;border:1px solid var(--line);border-left:4px solid var(--acc);"
    "border-radius:10px;padding:.6em 1.2em;margin:1em 0 2em}#answer.none{border-left-color:#c92a2a}"
    "#verdict{font-weight:600}"
    "#answer h4{margin:.8em 0 .2em;font-size:.85em;color:var(--mute)}"
    "pre{background:#1d232b;color:#e9ecef;padding:.7em .9em;border-radius:6px;white-space:pre-wrap;"
    "word-break:break-all;font-size:.85em;margin:0}#notes{color:var(--mute);margin:.2em 0}"
    "table{border-collapse:collapse;margin-bottom:2em;background:#fff;font-size:.88em}"
    "td,th{border:1px solid var(--line);padding:.3em .6em;text-align:left;vertical-align:top}"
    "th{background:#eef1f4}.built{background:var(--ok)}.failed{background:var(--bad)}"
    ".not-built{background:var(--no);color:var(--mute)}td a{margin-right:.4em;white-space:nowrap}"
    ".built a:first-child{display:block}.built a+a{font-size:.85em}"
    "td:first-child,.built,.failed{white-space:nowrap}tr.hit td{background-image:linear-gradient(#3b5bdb22,"
    "#3b5bdb22)}summary{cursor:pointer;color:var(--acc)}code{font-size:.85em;word-break:break-all}"
)

# Reads the grid (see the module's docstring); every string it shows of a row is the row's own.
_SCRIPT = r"""(function(){
var d=document,$=function(i){return d.getElementById(i)},
each=function(l,f){Array.prototype.forEach.call(l,f)};
each(d.querySelectorAll('code[data-index]'),function(c){var i=c.getAttribute('data-index'),
u=new URL(i,d.baseURI).href;c.textContent=c.textContent.split(i).join(u)});
var BESIDE=__BESIDE__,DEFAULT=__DEFAULT__,rows=[];
each(d.querySelectorAll('table[data-p]'),function(t){
var heads=[];each(t.rows[0].cells,function(c){heads.push(c.textContent)});
each(t.querySelectorAll('tr[data-w]'),function(tr){var s=tr.dataset,
r={p:t.dataset.p,v:tr.cells[0].textContent,n:rows.length,tr:tr,py:{},cmd:[]};each(tr.querySelectorAll('code'),function(c){r.cmd.push(c.textContent)});
each(tr.cells,function(td,i){var f=td.dataset.f,m=td.dataset.m||s.m;if(f===undefined)return;
var href=s.w+f+s.x,
when=td.textContent.replace('built','').trim();td.textContent='';var a=d.createElement('a');a.href=href;
a.textContent=when||'wheel';a.title=decodeURIComponent(href.split('/').pop());td.appendChild(a);
each((td.dataset.s||'').split(''),function(l){var b=BESIDE[l];if(!b)return;var x=d.createElement('a');
x.href=href+b[0];x.textContent=b[1];td.appendChild(x)});if(m)r.py[heads[i]]=m});
if(s.cu){r.cu=s.cu;r.t=s.t;r.abi=s.abi;r.a=s.a.split(' ');rows.push(r)}});});
var form=$('pick');if(!form||!rows.length)return;form.hidden=false;$('answer').hidden=false;
function num(v){return v.split('.').map(Number)}
function cmp(a,b){a=num(a);b=num(b);for(var i=0;i<Math.max(a.length,b.length);i++){var x=a[i]||0,y=b[i]||0;
if(x!=y)return x<y?-1:1}return 0}
var names={};each($('gpus').options,function(o){names[o.value.replace(/\s+/g,'').toLowerCase()]=o.label});
function gpu(text){var k=text.replace(/\s+/g,'').toLowerCase();if(!k)return null;if(names[k])k=names[k];
var m=/^([1-9]\d?)\.(\d)$/.exec(k)||/^(?:sm_?)?([1-9]\d?)(\d)$/.exec(k);return m?m[1]+'.'+m[2]:false}
function runs(arch,g){var a=/^(\d+)\.(\d)([af]?)$/.exec(arch),h=num(g);if(!a)return false;
return a[3]=='a'?(+a[1]==h[0]&&+a[2]==h[1]):(+a[1]==h[0]&&+a[2]<=h[1])}
function driverRuns(dr,cu){var h=num(dr),w=num(cu);if(w[0]>h[0])return['built for CUDA '+cu+
', the driver runs CUDA '+dr+' at most (a newer driver would)'];if(w[0]==h[0]&&w[1]>h[1])return[null,
'built with CUDA '+cu+', the driver\'s is '+dr+': runs by CUDA minor version compatibility'];return[null]}
function pick(){var c={p:$('project').value,m:$('platform').value,cu:$('cuda').value,t:$('torch').value,
py:$('python').value,abi:$('abi').value,g:gpu($('gpu').value)};var fits=[],near=[];
rows.forEach(function(r){if(r.p!=c.p)return;var why=[],notes=[];
if(c.cu){var v=c.cu.slice(2);if(c.cu[0]=='d'){var x=driverRuns(v,r.cu);if(x[0])why.push(x[0]);
if(x[1])notes.push(x[1])}else if(num(v)[0]!=num(r.cu)[0])why.push('built for CUDA '+r.cu+
', torch here uses CUDA '+v);else if(v!=r.cu)notes.push('built with CUDA '+r.cu+', torch here uses CUDA '+v+
' (same major: compatible)')}
if(c.t&&c.t!=r.t)why.push('built for torch '+r.t);
if(c.abi&&c.abi!=r.abi)why.push('built with cxx11 ABI '+r.abi);
if(c.g&&!r.a.some(function(a){return runs(a,c.g)}))why.push('no code for compute capability '+c.g+
'; built for '+r.a.join(', '));
var pys=Object.keys(r.py).filter(function(p){return!c.m||r.py[p]==c.m||r.py[p]=='any'});
if(!pys.some(function(p){return!c.py||p==c.py||!/^\d+\.\d+$/.test(p)}))
why.push('no wheel for '+(c.py?'Python '+c.py:'this platform')+(c.m?' on '+c.m:''));
(why.length?near:fits).push({r:r,why:why,notes:notes})});
fits.sort(function(a,b){return cmp(b.r.t,a.r.t)||a.notes.length-b.notes.length||cmp(b.r.cu,a.r.cu)||
a.r.a.length-b.r.a.length||(a.r.v<b.r.v?-1:a.r.v>b.r.v?1:a.r.n-b.r.n)});
near.sort(function(a,b){return a.why.length-b.why.length||cmp(b.r.t,a.r.t)});
each(d.querySelectorAll('tr.hit'),function(tr){tr.classList.remove('hit')});
var ans=$('answer'),notes=$('notes');notes.textContent='';
function note(t){var li=d.createElement('li');li.textContent=t;notes.appendChild(li)}
if(fits.length){var f=fits[0];ans.className='';f.r.tr.classList.add('hit');
$('verdict').textContent=c.p+': variant '+f.r.v+(c.m?' on '+c.m:'');$('pip').textContent=f.r.cmd[0]||'';
$('uv').textContent=f.r.cmd[1]||'';f.notes.forEach(note);
if(!c.g)note('pick the GPU to be sure the wheel has code for it');
$('commands').hidden=false;$('missing').hidden=true;return}
ans.className='none';$('commands').hidden=true;$('missing').hidden=false;
var cu=c.cu?c.cu.slice(2):'',rcu=cu,po=$('python').options;
if(c.cu&&c.cu[0]=='d'){var ok=rows.map(function(r){return r.cu}).filter(function(u){
return !driverRuns(cu,u)[0]}).sort(cmp);rcu=ok.length?ok[ok.length-1]:cu}
function newest(k){return rows.filter(function(r){return r.p==c.p}).map(function(r){return r[k]})
.sort(cmp).pop()}
if(!rcu)rcu=newest('cu');var t=c.t||newest('t'),py=c.py||(po.length>1?po[1].value:'3'),
abi=c.abi||newest('abi'),g=c.g?', GPUs '+c.g:', GPUs unknown',on=c.m&&c.m!=DEFAULT?c.m:'';
$('verdict').textContent='No wheel fits: missing '+c.p+' for Python '+py+(on?' on '+on:'')+', CUDA '+rcu+
', torch '+t+', cxx11 ABI '+abi+g;
if(c.g===false)note('unknown GPU: type its name or compute capability (9.0)');
if(near.length)note('nearest: '+near[0].r.v+' ('+near[0].why.join('; ')+')');
$('lines').textContent=['matrix:','  include:','    - {cuda: "'+rcu+'", torch: "'+t+'", python: "'+py+
'", cxx11_abi: '+(abi=='1'?'true':'false')+(c.g?', arch: "'+c.g+'"':'')+(on?', platform: '+on:'')+'}']
.join('\n')}
each(form.elements,function(e){e.addEventListener('input',pick);e.addEventListener('change',pick)});pick();
})();"""


def human_page(cells: Iterable[MatrixCell]) -> str:
    """index.html at the index root: the install selector, then per project a grid of variants x Pythons
    with the install commands of each variant."""
    cells = list(cells)
    by_project: dict[str, list[MatrixCell]] = {}
    for cell in cells:
        by_project.setdefault(cell.project, []).append(cell)
    body: list[str] = []
    if not by_project:
        body.append("<p>Nothing published yet.</p>")
    else:
        body += _selector(cells)
        body.append(
            "<noscript><p>Without JavaScript, take the install command of the row that fits your machine "
            "in the grid below.</p></noscript>"
        )
        body.append("<h2>Build matrix</h2>")
        body.append(
            '<p class="lead">Each row is a variant index, each column a Python: built (with the date it was '
            "published, the wheel and what is published beside it), failed (with the reason), not built.</p>"
        )
    for project in sorted(by_project):
        body += _grid(project, by_project[project])
    beside = {letter: [BESIDE[name], text] for name, (letter, text) in _BESIDE_LETTERS.items()}
    script = _SCRIPT.replace("__BESIDE__", json.dumps(beside, separators=(",", ":"))).replace(
        "__DEFAULT__", json.dumps(_DEFAULT)
    )
    lines = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "  <head>",
        '    <meta charset="utf-8">',
        '    <meta name="viewport" content="width=device-width,initial-scale=1">',
        "    <title>Wheel index</title>",
        f"    <style>{_STYLE}</style>",
        "  </head>",
        "  <body><main>",
        "    <h1>Wheel index</h1>",
        '    <p class="lead">Prebuilt wheels, one index per variant (<a href="simple/">simple/</a>). '
        "Pick your machine for the exact install command, or run "
        "<code>factory which --index-url URL/simple/</code> on it.</p>",
        *(f"    {line}" for line in body),
        f"    <script>{script}</script>",
        "  </main></body>",
        "</html>",
        "",
    ]
    return "\n".join(lines)
