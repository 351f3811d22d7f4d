"""`file_analyzer`: document files of the workspace as text, paginated, confined to the workspace."""

import json
import os
import zipfile

import pytest

from toolself.tools.base import ToolContext
from toolself.tools.files import file_analyzer
from toolself.tools.visit import PAGE_CHARS


@pytest.fixture(scope="module")
def ctx():
    """One attempt for the module: its converter process loads markitdown once (about 2 s)."""
    context = ToolContext.temporary()
    yield context
    context.close()


def read(ctx, path, page=1):
    return file_analyzer({"path": path, "page": page}, ctx)


def make_pdf(path, text):
    """A one-page PDF with real xref offsets, written by hand so the test needs no PDF writer."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))


def make_docx(path, paragraphs):
    body = "".join(f"<w:p><w:r><w:t>{p}</w:t></w:r></w:p>" for p in paragraphs)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("[Content_Types].xml",
                   '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                   '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                   '<Default Extension="xml" ContentType="application/xml"/>'
                   '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
        z.writestr("_rels/.rels",
                   '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>')
        z.writestr("word/document.xml",
                   '<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
                   f"<w:body>{body}</w:body></w:document>")


def test_csv_becomes_a_markdown_table(ctx):
    (ctx.workspace / "t.csv").write_text("city,pop\nLisbon,545000\nPorto,232000\n")
    content = read(ctx, "t.csv").content
    assert "| city | pop |" in content and "| Lisbon | 545000 |" in content


def test_json_and_html(ctx):
    (ctx.workspace / "d.json").write_text(json.dumps({"planet": "Mars", "moons": 2}))
    assert '"planet": "Mars"' in read(ctx, "d.json").content
    (ctx.workspace / "p.html").write_text("<html><body><h1>Report</h1><p>Revenue grew 7%.</p></body></html>")
    html = read(ctx, "p.html").content
    assert "# Report" in html and "Revenue grew 7%." in html


def test_pdf_text(ctx):
    make_pdf(ctx.workspace / "doc.pdf", "The treaty was signed in 1648.")
    assert "The treaty was signed in 1648." in read(ctx, "doc.pdf").content


def test_docx_paragraphs(ctx):
    make_docx(ctx.workspace / "memo.docx", ["Quarterly memo", "Budget approved on Monday."])
    content = read(ctx, "memo.docx").content
    assert "Quarterly memo" in content and "Budget approved on Monday." in content


def test_xlsx_sheets(ctx):
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    book.active.title = "Sales"
    book.active.append(["region", "units"])
    book.active.append(["north", 120])
    book.save(ctx.workspace / "s.xlsx")
    content = read(ctx, "s.xlsx").content
    assert "Sales" in content and "| north | 120 |" in content


def test_pptx_slides(ctx):
    pptx = pytest.importorskip("pptx")
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Roadmap"
    slide.placeholders[1].text = "Ship the parser in May"
    deck.save(ctx.workspace / "deck.pptx")
    content = read(ctx, "deck.pptx").content
    assert "Roadmap" in content and "Ship the parser in May" in content


def test_long_file_is_paginated(ctx):
    (ctx.workspace / "long.txt").write_text("\n".join(f"row {i} " + "data " * 20 for i in range(1000)))
    first = read(ctx, "long.txt").content
    assert "(page 1 of" in first and "page=2" in first
    assert len(first) < PAGE_CHARS + 300
    pages = int(first.split("(page 1 of ")[1].split(")")[0])
    assert "row 999" in read(ctx, "long.txt", page=pages).content
    assert read(ctx, "long.txt", page=pages + 1).is_error


def test_paths_outside_the_workspace_are_refused(ctx, tmp_path):
    (tmp_path / "secret.csv").write_text("a,b\n")
    for path in ("../secret.csv", str(tmp_path / "secret.csv"), "/etc/passwd"):
        obs = read(ctx, path)
        assert obs.is_error and "outside the workspace" in obs.content
    (ctx.workspace / "link.csv").symlink_to(tmp_path / "secret.csv")
    assert "symbolic link" in read(ctx, "link.csv").content
    assert read(ctx, "missing.pdf").is_error


def test_conversion_runs_in_the_attempts_sandbox(ctx):
    (ctx.workspace / "c.csv").write_text("a\n1\n")
    read(ctx, "c.csv")
    pid = ctx.resources["file_converter"].process.proc.pid
    user = ctx.resources["sandbox_user"]
    assert os.stat(f"/proc/{pid}").st_uid == (user.uid if user.dedicated else os.geteuid())


def test_corrupt_file_is_an_error_observation(ctx):
    (ctx.workspace / "broken.xlsx").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    obs = read(ctx, "broken.xlsx")
    assert obs.is_error and "broken.xlsx" in obs.content
