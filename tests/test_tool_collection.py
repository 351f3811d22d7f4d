"""The local collection: loading folders and JSONL, BM25 ranking, passage snippets, the disk cache."""

import json
import os
import time

import pytest

from toolself.tools.collection import Collection, Document


def _docs(n=200):
    docs = [Document(f"doc{i}", f"Report {i}", f"Routine filler text about weather and markets number {i}.")
            for i in range(n)]
    docs.append(Document("eiffel", "Eiffel Tower",
                         "Opening paragraph about Paris in general. " * 30
                         + "The Eiffel Tower was completed in 1889 for the World's Fair. "
                         + "Closing remarks about tourism. " * 30))
    return docs


def test_ranks_the_matching_document_first():
    results = Collection.from_documents(_docs()).search("when was the Eiffel tower completed")
    assert results[0].locator == "eiffel"
    assert results[0].title == "Eiffel Tower"


def test_snippet_is_the_best_matching_passage_not_the_head():
    snippet = Collection.from_documents(_docs()).search("Eiffel tower completed")[0].snippet
    assert "completed in 1889" in snippet
    assert snippet.startswith("…")


def test_stemming_matches_inflected_forms():
    collection = Collection.from_documents([Document("a", "A", "The runners were running quickly."),
                                            Document("b", "B", "Bakers bake bread.")])
    assert collection.search("run")[0].locator == "a"


def test_no_match_gives_no_results():
    collection = Collection.from_documents(_docs())
    assert collection.search("zyzzyva quux") == []
    assert collection.search("the of and") == []


def test_small_collection_indexes_in_milliseconds():
    docs = _docs(300)
    Collection.from_documents(docs[:5]).search("warm up")
    start = time.perf_counter()
    Collection.from_documents(docs).search("Eiffel")
    assert time.perf_counter() - start < 2  # a guard against a pathological build; speed is benchmarked


def test_folder_of_text_markdown_and_html(tmp_path):
    (tmp_path / "notes.txt").write_text("Plain text about volcanoes and lava.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "guide.md").write_text("# Glacier Guide\n\nIce moves slowly down valleys.")
    (tmp_path / "page.html").write_text("<html><head><title>Desert Page</title><script>var dunes=1</script></head>"
                                        "<body><p>Sand dunes migrate with wind.</p></body></html>")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    collection = Collection.from_path(tmp_path, cache_dir=tmp_path / ".cache")
    assert sorted(d.locator for d in collection.documents) == ["notes.txt", "page.html", "sub/guide.md"]
    assert collection.get("sub/guide.md").title == "Glacier Guide"
    page = collection.get("page.html")
    assert page.title == "Desert Page" and "Sand dunes" in page.text and "var dunes" not in page.text
    assert collection.search("glacier ice")[0].locator == "sub/guide.md"


def test_jsonl_with_id_and_contents_fields(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "x1", "title": "Saturn", "contents": "Saturn has rings of ice."},
            {"locator": "x2", "text": "Mars is red."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    collection = Collection.from_path(path, cache_dir=tmp_path / "cache")
    assert collection.get("x2").title == "x2"
    assert collection.search("rings")[0].locator == "x1"


def test_bad_jsonl_line_is_named(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "ok"}\n{"title": "no id"}\n')
    with pytest.raises(ValueError, match="line 2"):
        Collection.from_path(path, cache_dir=tmp_path / "cache")


def test_index_is_cached_and_reused(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Alpha particles.")
    cache = tmp_path / "cache"
    Collection.from_path(tmp_path / "docs", cache_dir=cache)
    meta = (cache / "meta.json").stat().st_mtime_ns
    again = Collection.from_path(tmp_path / "docs", cache_dir=cache)
    assert (cache / "meta.json").stat().st_mtime_ns == meta
    assert again.search("alpha")[0].locator == "a.txt"


def test_changed_folder_invalidates_the_cache(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Alpha particles.")
    cache = tmp_path / "cache"
    Collection.from_path(tmp_path / "docs", cache_dir=cache)
    (tmp_path / "docs" / "b.txt").write_text("Beta decay.")
    assert Collection.from_path(tmp_path / "docs", cache_dir=cache).search("beta")[0].locator == "b.txt"


def test_changed_jsonl_invalidates_the_cache(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "old words"}) + "\n")
    stat = path.stat()
    Collection.from_path(path, cache_dir=tmp_path / "cache")
    path.write_text(json.dumps({"id": "a", "text": "new terms"}) + "\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: the content decides
    assert Collection.from_path(path, cache_dir=tmp_path / "cache").search("new")[0].locator == "a"


def test_default_cache_lives_under_toolself_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLSELF_CACHE", str(tmp_path / "c"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Gamma rays.")
    Collection.from_path(tmp_path / "docs")
    assert list((tmp_path / "c" / "index").glob("*/meta.json"))


def test_duplicate_locators_are_refused():
    with pytest.raises(ValueError, match="share the locator"):
        Collection.from_documents([Document("a", "A", "x"), Document("a", "B", "y")])


def test_pdf_files_in_a_folder_are_indexed(tmp_path):
    stream = b"BT /F1 12 Tf 72 720 Td (Photosynthesis happens in chloroplasts.) Tj ET"
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    pdf, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 6\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    pdf += b"trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "biology.pdf").write_bytes(bytes(pdf))
    collection = Collection.from_path(tmp_path / "docs", cache_dir=tmp_path / "cache")
    assert collection.search("chloroplasts")[0].locator == "biology.pdf"


def test_concurrent_searches_agree_with_serial_ones():
    from concurrent.futures import ThreadPoolExecutor

    collection = Collection.from_documents(_docs(300))
    queries = ["Eiffel tower", "weather markets 17", "tourism Paris", "number 250"] * 10
    serial = [collection.search(q) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(collection.search, queries)) == serial


def test_unwritable_cache_still_gives_a_working_collection(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Delta waves.")
    (tmp_path / "blocker").write_text("a file where the cache folder's parent should be")
    collection = Collection.from_path(tmp_path / "docs", cache_dir=tmp_path / "blocker" / "cache")
    assert collection.search("delta")[0].locator == "a.txt"
