"""Tool search: BM25 over each tool's name, title, description and parameter names (a name counts three
times, a title twice), with a light stemmer so that `commits` finds `list_commits`. Built once per
catalog; a query filters by what the caller may use before ranking, so nothing else is ever returned."""

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

K1, B = 1.2, 0.75
NAME_WEIGHT, TITLE_WEIGHT = 3, 2
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
STOP_WORDS = frozenset("a an and are as at be by for from in into is it of on or that the this to with".split())
SUFFIXES = ("ies", "ing", "ed", "es", "s")


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


@dataclass(frozen=True)
class Hit:
    name: str
    score: float


class SearchIndex:
    def __init__(self, definitions: Iterable[dict[str, Any]]) -> None:
        self.names: list[str] = []
        self.lengths: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)  # term -> (doc, frequency)
        for definition in definitions:
            words = document(definition)
            doc = len(self.names)
            self.names.append(definition["name"])
            self.lengths.append(len(words))
            for term, frequency in Counter(words).items():
                self.postings[term].append((doc, frequency))
        self.average = sum(self.lengths) / len(self.lengths) if self.lengths else 1.0

    def search(self, query: str, k: int, allowed: Callable[[str], bool]) -> list[Hit]:
        """The k best tools for the query among those `allowed` says the caller may use."""
        scores: dict[int, float] = defaultdict(float)
        count = len(self.names)
        for term in set(terms(query)):
            postings = self.postings.get(term, [])
            idf = math.log(1 + (count - len(postings) + 0.5) / (len(postings) + 0.5))
            for doc, frequency in postings:
                norm = K1 * (1 - B + B * self.lengths[doc] / self.average)
                scores[doc] += idf * frequency * (K1 + 1) / (frequency + norm)
        best: list[Hit] = []
        for doc, score in sorted(scores.items(), key=lambda item: -item[1]):
            if allowed(self.names[doc]):
                best.append(Hit(self.names[doc], score))
                if len(best) == k:
                    break
        return best
