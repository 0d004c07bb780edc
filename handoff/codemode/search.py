"""Tool search: BM25 over each tool's name, title, description and parameter names (a name counts three
times, a title twice), with a light stemmer so that `commits` finds `list_commits`; combined, once its
vectors are ready, with the cosine similarity of sentence embeddings (embeddings.py), so that `folder`
finds `create_directory`. Built once per catalog; a query filters by what the caller may use before
ranking, so nothing else is ever returned."""

import math
import re
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from handoff.codemode.embeddings import encoder

K1, B = 1.2, 0.75
NAME_WEIGHT, TITLE_WEIGHT = 3, 2
SEMANTIC_SHARE = 0.3  # of the combined score: cosine similarity; the rest is BM25 scaled to [0, 1]
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
STOP_WORDS = frozenset("a an and are as at be by for from in into is it of on or that the this to with".split())
SUFFIXES = ("ies", "ing", "ed", "es", "s")
SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def stem(word: str) -> str:
    """`stage`, `staged`, `staging` and `stages` all become `stag`: crude, but the same for query and tool."""
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def terms(text: str) -> list[str]:
    """`listCommits`, `list_commits` and `List commits` all give ["list", "commit"]."""
    words = (word.lower() for word in WORD.findall(text or ""))
    return [stem(word) for word in words if word not in STOP_WORDS]


def parameter_names(schema: Any) -> list[str]:
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    return [str(name) for name in schema["properties"]]


def document(definition: dict[str, Any]) -> list[str]:
    """The words a tool is found by, weighted by field."""
    name = terms(definition.get("name", "")) * NAME_WEIGHT
    title = terms(definition.get("title") or "") * TITLE_WEIGHT
    parameters = terms(" ".join(parameter_names(definition.get("inputSchema"))))
    return name + title + terms(definition.get("description") or "") + parameters


def sentence(definition: dict[str, Any]) -> str:
    """What a tool's embedding is made of: its name's words and the first sentence of its description
    (short texts keep embedding a catalog cheap; whole descriptions ranked no better)."""
    words = " ".join(WORD.findall(definition.get("name", ""))).lower()
    first = SENTENCE_END.split((definition.get("description") or "").strip(), maxsplit=1)[0]
    return f"{definition.get('title') or words}: {first}"


class SearchIndex:
    def __init__(self, definitions: Iterable[dict[str, Any]]) -> None:
        self.names: list[str] = []
        self.sentences: list[str] = []
        self.lengths: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)  # term -> (doc, frequency)
        for definition in definitions:
            words = document(definition)
            doc = len(self.names)
            self.names.append(definition["name"])
            self.sentences.append(sentence(definition))
            self.lengths.append(len(words))
            for term, frequency in Counter(words).items():
                self.postings[term].append((doc, frequency))
        self.average = sum(self.lengths) / len(self.lengths) if self.lengths else 1.0
        self.vectors: np.ndarray | None = None  # a unit row per tool, once an Embedder filled it

    def lexical(self, query: str) -> tuple[np.ndarray, float]:
        """BM25 scores, and the most any tool could score: what matching every term at saturation gives."""
        scores, ceiling = np.zeros(len(self.names)), 0.0
        count = len(self.names)
        for term in set(terms(query)):
            postings = self.postings.get(term, [])
            idf = math.log(1 + (count - len(postings) + 0.5) / (len(postings) + 0.5))
            ceiling += idf * (K1 + 1)
            for doc, frequency in postings:
                norm = K1 * (1 - B + B * self.lengths[doc] / self.average)
                scores[doc] += idf * frequency * (K1 + 1) / (frequency + norm)
        return scores, ceiling

    def search(
        self, query: str, k: int, allowed: Callable[[str], bool], query_vector: np.ndarray | None = None
    ) -> list[str]:
        """The names of the k best tools for the query, best first, among those `allowed` says the caller may use."""
        scores, ceiling = self.lexical(query)
        vectors = self.vectors
        if vectors is not None and query_vector is not None:
            # Scaled by the ceiling, not by the best match: a tool sharing one word of a long query stays small.
            lexical = scores / ceiling if ceiling else scores
            scores = (1 - SEMANTIC_SHARE) * lexical + SEMANTIC_SHARE * (vectors @ query_vector)
        hits: list[str] = []
        for doc in np.argsort(-scores, kind="stable"):
            if scores[doc] <= 0:
                break
            if allowed(self.names[doc]):
                hits.append(self.names[doc])
                if len(hits) == k:
                    break
        return hits


class VectorStore(Protocol):
    """Where vectors outlive the process (vectors.py): what one process embedded, the others load."""

    def load(self, sentences: list[str]) -> dict[str, np.ndarray]: ...

    def save(self, vectors: dict[str, np.ndarray]) -> None: ...


class Embedder:
    """Fills an index's vectors in a thread of its own, so that no search waits for a catalog to be
    embedded (it ranks lexically until then). A sentence the last catalog had is not embedded again, nor
    one the store holds."""

    def __init__(self, store: VectorStore | None = None) -> None:
        self.known: dict[str, np.ndarray] = {}
        self.lock = threading.Lock()
        self.store = store

    def start(self, index: SearchIndex) -> None:
        threading.Thread(target=self.fill, args=(index,), name="tool-embeddings", daemon=True).start()

    def fill(self, index: SearchIndex) -> int:
        """Give the index its vectors; how many sentences had to be embedded here."""
        with self.lock:
            self.encoder = encoder()  # loaded here, the first time: reading 90 MB of weights takes a while
            missing = [text for text in dict.fromkeys(index.sentences) if text not in self.known]
            if self.store is not None and missing:
                self.known.update(self.store.load(missing))
                missing = [text for text in missing if text not in self.known]
            if missing:
                embedded = dict(zip(missing, self.encoder.embed(missing), strict=True))
                self.known.update(embedded)
                if self.store is not None:
                    self.store.save(embedded)
            self.known = {text: self.known[text] for text in index.sentences}  # what the next catalog reuses
            index.vectors = np.stack([self.known[text] for text in index.sentences]) if index.sentences else None
            return len(missing)

    def query(self, text: str) -> np.ndarray:
        """A query's vector; only asked for once an index has vectors, so the encoder is loaded."""
        return self.encoder.embed([text])[0]
