"""The offline document collection behind `search` and `visit`.

Every benchmark and test must run without a network, so the search tool's default backend is
a local collection ranked by BM25 (bm25s). A collection is a folder of text, markdown, HTML
or PDF files (locator = relative path) or a JSONL of documents. Indexing a large collection
takes time, so the index and the extracted texts are cached on disk under one folder per
collection path and rebuilt only when the collection's fingerprint changes (names, sizes and
modification times of a folder's files; the bytes of a JSONL). Collections made in memory
(the built-in suites make a few hundred documents per task) are indexed lazily in memory.

Snippets show the passage of a hit that best covers the query terms, not the document's head:
a model deciding what to visit needs to see why a document matched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:  # bm25s and numpy load when a collection is indexed, not with the CLI
    import bm25s
    import numpy as np

log = logging.getLogger(__name__)

INDEX_FORMAT = 2
TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".text"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
_TOKEN = re.compile(r"\w\w+")


@dataclass(frozen=True)
class Document:
    locator: str
    title: str
    text: str


@dataclass(frozen=True)
class SearchResult:
    """date: when the page was published, as the search service wrote it ("" when it gave none)."""

    locator: str
    title: str
    snippet: str
    score: float
    date: str = ""


class Analyzer:
    """Lower-case, split, drop English stopwords, stem when PyStemmer is installed.

    Documents and queries go through the same analyzer; its name is part of the cache
    fingerprint so that an index built with a stemmer is never queried without one. Each
    distinct word is stemmed once and remembered ('' for a stopword): indexing then costs a
    regex pass and a dictionary lookup per word.
    """

    def __init__(self) -> None:
        from bm25s.stopwords import STOPWORDS_EN

        self._stopwords = frozenset(STOPWORDS_EN)
        try:
            import Stemmer  # PyStemmer

            self._stem_words = Stemmer.Stemmer("english").stemWords
            self.name = "pystemmer-english"
        except ImportError:  # a plain lower-cased index still works, with lower recall
            self._stem_words = None
            self.name = "lower"
        self.stem_of: dict[str, str] = {}
        self._lock = threading.Lock()

    MAX_WORDS = 5_000_000

    def learn(self, words: Iterable[str]) -> dict[str, str]:
        """Stem the words not seen yet; return them. Safe to call from several threads: the
        shared table only grows (up to a bound), so a word once found stays found."""
        missing = [w for w in (words if isinstance(words, set) else set(words)) if w not in self.stem_of]
        if not missing:
            return {}
        if self._stem_words:
            with self._lock:  # a PyStemmer object must not be used by two threads at once
                stems = self._stem_words(missing)
        else:
            stems = missing
        learned = {w: "" if w in self._stopwords else s for w, s in zip(missing, stems)}
        if len(self.stem_of) < self.MAX_WORDS:
            self.stem_of.update(learned)
        return learned

    def stems(self, words: list[str]) -> list[str]:
        """One stem per word, '' for stopwords (positions kept, for passage finding)."""
        learned = self.learn(words)
        stem_of = self.stem_of
        if learned and len(stem_of) >= self.MAX_WORDS:
            return [stem_of[w] if w in stem_of else learned[w] for w in words]
        return [stem_of[w] for w in words]

    def words(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())

    def tokens(self, text: str) -> list[str]:
        return [s for s in self.stems(self.words(text)) if s]


_ANALYZER: Analyzer | None = None


def analyzer() -> Analyzer:
    global _ANALYZER
    if _ANALYZER is None:
        _ANALYZER = Analyzer()
    return _ANALYZER


class _HTMLText(HTMLParser):
    """Visible text and <title> of an HTML page; stdlib only, so local HTML needs no extra."""

    _SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
              "table", "ul", "ol", "pre", "blockquote", "header", "footer"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self._SKIP:
            self._skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self._SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.parts.append(data)

    def text(self) -> str:
        joined = "".join(self.parts)
        lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in joined.splitlines()]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document."""
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return parser.title.strip(), parser.text()


def _pdf_text(path: Path) -> str:
    try:
        from pdfminer.high_level import extract_text
    except ImportError:
        try:
            from pypdf import PdfReader
        except ImportError as exc:
            raise RuntimeError("reading PDF files needs pdfminer.six or pypdf (pip install 'toolself[tools]')") from exc
        return "\n\n".join(page.extract_text() or "" for page in PdfReader(str(path)).pages)
    return extract_text(str(path))


def load_file(path: Path, locator: str) -> Document:
    suffix = path.suffix.lower()
    if suffix in HTML_SUFFIXES:
        title, text = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
        return Document(locator, title or path.stem, text)
    if suffix in PDF_SUFFIXES:
        return Document(locator, path.stem, _pdf_text(path))
    text = path.read_text(encoding="utf-8", errors="replace")
    title = path.stem
    if suffix in {".md", ".markdown"}:
        heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
        if heading:
            title = heading.group(1).strip()
    return Document(locator, title, text)


def _collection_files(root: Path) -> list[Path]:
    suffixes = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and Path(name).suffix.lower() in suffixes:
                files.append(Path(dirpath) / name)
    return files


def _jsonl_documents(path: Path) -> Iterator[Document]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path.name}, line {number}: not JSON ({exc})") from None
            locator = row.get("locator", row.get("id"))
            text = row.get("text", row.get("contents"))
            if locator is None or text is None:
                raise ValueError(f"{path.name}, line {number}: a document needs 'id' or 'locator' and 'text' or 'contents'")
            yield Document(str(locator), str(row.get("title") or locator), str(text))


def cache_root() -> Path:
    base = os.environ.get("TOOLSELF_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "toolself") / "index"


class Collection:
    """Documents by locator, with a BM25 index over title and text."""

    def __init__(self, documents: Iterable[Document], *, name: str = "collection"):
        self.name = name
        self.documents: list[Document] = []
        self._by_locator: dict[str, int] = {}
        for doc in documents:
            if doc.locator in self._by_locator:
                raise ValueError(f"two documents share the locator {doc.locator!r}")
            self._by_locator[doc.locator] = len(self.documents)
            self.documents.append(doc)
        self._index: bm25s.BM25 | None = None
        self._df: np.ndarray | None = None

    # construction -------------------------------------------------------------------------

    @classmethod
    def from_documents(cls, documents: Iterable[Document | dict], *, name: str = "collection") -> "Collection":
        docs = []
        for d in documents:
            if isinstance(d, Document):
                docs.append(d)
            else:
                locator = d.get("locator", d.get("id"))
                docs.append(Document(str(locator), str(d.get("title") or locator), str(d.get("text", d.get("contents", "")))))
        return cls(docs, name=name)

    @classmethod
    def from_path(cls, path: str | Path, *, cache_dir: str | Path | None = None) -> "Collection":
        """Load a folder or JSONL, reusing the on-disk index when the collection is unchanged."""
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"no collection at {path}")
        fingerprint = cls._fingerprint(path)
        cache = Path(cache_dir) if cache_dir else cache_root() / hashlib.sha256(str(path).encode()).hexdigest()[:24]
        cached = cls._load_cache(cache, fingerprint, name=path.name)
        if cached is not None:
            return cached
        if path.is_dir():
            docs = []
            for file in _collection_files(path):
                locator = file.relative_to(path).as_posix()
                try:
                    docs.append(load_file(file, locator))
                except Exception as exc:  # one unreadable file must not lose the collection
                    log.warning("skipping %s: %s", locator, exc)
        else:
            docs = list(_jsonl_documents(path))
        collection = cls(docs, name=path.name)
        collection._save_cache(cache, fingerprint)
        return collection

    @staticmethod
    def _fingerprint(path: Path) -> str:
        digest = hashlib.sha256(f"{INDEX_FORMAT}|{analyzer().name}|{path}".encode())
        if path.is_dir():
            for file in _collection_files(path):
                st = file.stat()
                digest.update(f"{file.relative_to(path).as_posix()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        else:
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()

    @classmethod
    def _load_cache(cls, cache: Path, fingerprint: str, *, name: str) -> "Collection | None":
        try:
            meta = json.loads((cache / "meta.json").read_text())
            if meta.get("fingerprint") != fingerprint:
                return None
            with (cache / "documents.jsonl").open(encoding="utf-8") as handle:
                docs = [Document(**json.loads(line)) for line in handle]
            collection = cls(docs, name=name)
            if docs:
                import bm25s

                collection._index = bm25s.BM25.load(str(cache / "bm25"), mmap=True, show_progress=False, verbosity=0)
            return collection
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save_cache(self, cache: Path, fingerprint: str) -> None:
        """Write into a sibling temporary folder, then swap it in, so readers never see half an index."""
        tmp: Path | None = None
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
            with (tmp / "documents.jsonl").open("w", encoding="utf-8") as handle:
                for doc in self.documents:
                    handle.write(json.dumps(asdict(doc), ensure_ascii=False) + "\n")
            if self.documents:
                self.index.save(str(tmp / "bm25"), show_progress=False)
            (tmp / "meta.json").write_text(json.dumps({"fingerprint": fingerprint, "documents": len(self)}))
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        except OSError as exc:  # a read-only cache only costs re-indexing next time
            log.warning("could not cache the index in %s: %s", cache, exc)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    # access -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.documents)

    def __contains__(self, locator: object) -> bool:
        return locator in self._by_locator

    def get(self, locator: str) -> Document | None:
        i = self._by_locator.get(locator)
        return None if i is None else self.documents[i]

    @property
    def index(self) -> bm25s.BM25:
        if self._index is None:
            self._index = self._build_index()
        return self._index

    def _build_index(self) -> bm25s.BM25:
        import bm25s

        an = analyzer()
        vocab: dict[str, int] = {}
        word_id: dict[str, int] = {}  # raw word -> token id, -1 for stopwords
        corpus: list[list[int]] = []
        for doc in self.documents:
            words = an.words(f"{doc.title}\n{doc.text}")
            try:
                corpus.append([i for w in words if (i := word_id[w]) >= 0])
            except KeyError:
                new = {w for w in words if w not in word_id}
                learned = an.learn(new)
                for w in new:
                    stem = an.stem_of[w] if w in an.stem_of else learned[w]
                    word_id[w] = vocab.setdefault(stem, len(vocab)) if stem else -1
                corpus.append([i for w in words if (i := word_id[w]) >= 0])
        index = bm25s.BM25()
        index.index((corpus, vocab), show_progress=False)
        return index

    def _document_frequency(self) -> np.ndarray:
        if self._df is None:
            import numpy as np

            self._df = np.diff(np.asarray(self.index.scores["indptr"]))
        return self._df

    def search(self, query: str, k: int = 5) -> list[SearchResult]:
        import numpy as np

        if not self.documents:
            return []
        an = analyzer()
        index = self.index
        terms = [t for t in dict.fromkeys(an.tokens(query)) if t in index.vocab_dict and t != ""]
        if not terms:
            return []
        scores = index.get_scores(terms)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        df = self._document_frequency()
        n = len(self.documents)
        weights = {t: math.log(1 + (n - df[index.vocab_dict[t]] + 0.5) / (df[index.vocab_dict[t]] + 0.5)) for t in terms}
        results = []
        for i in top:
            if scores[i] <= 0:
                break
            doc = self.documents[int(i)]
            results.append(SearchResult(doc.locator, doc.title, best_passage(doc.text, weights), float(scores[i])))
        return results


def best_passage(text: str, weights: dict[str, float], *, window: int = 40, max_chars: int = 200_000) -> str:
    """The window of `window` words whose distinct query terms weigh most (IDF), as a snippet."""
    text = text[:max_chars]
    spans = [(m.start(), m.end(), m.group().lower()) for m in _TOKEN.finditer(text)]
    if not spans:
        return _squash(text[:300])
    stems = analyzer().stems([w for _, _, w in spans])
    hits = [(i, s) for i, s in enumerate(stems) if s in weights]
    best_start = 0
    if hits:
        best_score = -1.0
        for j, (start, _) in enumerate(hits):
            seen = {}
            for i, stem in hits[j:]:
                if i >= start + window:
                    break
                seen[stem] = weights[stem]
            score = sum(seen.values())
            if score > best_score:
                best_score, best_start = score, start
        best_start = max(0, best_start - window // 8)
    end = min(len(spans), best_start + window) - 1
    snippet = _squash(text[spans[best_start][0]: spans[end][1]])
    prefix = "…" if best_start > 0 else ""
    suffix = "…" if end < len(spans) - 1 or len(text) == max_chars else ""
    return f"{prefix}{snippet}{suffix}"


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
