"""Code mode's tool vectors kept in the database (`ToolEmbedding`), keyed by the embedding model and the
SHA-256 of the sentence embedded, so that what one process computed every other loads. Used from the
embedder's own thread, which gives its connection back after each step."""

import hashlib
import logging

import numpy as np
from django.db import DatabaseError, connection

from registry.models import ToolEmbedding

logger = logging.getLogger(__name__)

CHUNK = 500  # digests per query: well under any database's limit on parameters


def _digest(sentence: str) -> str:
    return hashlib.sha256(sentence.encode("utf-8", "surrogatepass")).hexdigest()


class StoredVectors:
    def __init__(self, model: str) -> None:
        self.model = model

    def load(self, sentences: list[str]) -> dict[str, np.ndarray]:
        by_digest = {_digest(sentence): sentence for sentence in sentences}
        digests, found = list(by_digest), {}
        try:
            for start in range(0, len(digests), CHUNK):
                rows = ToolEmbedding.objects.filter(
                    model=self.model, sentence_sha256__in=digests[start : start + CHUNK]
                ).values_list("sentence_sha256", "vector")
                found |= {by_digest[digest]: np.frombuffer(bytes(vector), dtype="<f4") for digest, vector in rows}
        except DatabaseError:  # the vectors are computed here instead: slower, never wrong
            logger.warning("stored tool vectors could not be read", exc_info=True)
        finally:
            _release()
        return found

    def save(self, vectors: dict[str, np.ndarray]) -> None:
        rows = [
            ToolEmbedding(model=self.model, sentence_sha256=_digest(sentence), vector=vector.astype("<f4").tobytes())
            for sentence, vector in vectors.items()
        ]
        try:  # two processes may embed the same sentence at once: the first row stands
            ToolEmbedding.objects.bulk_create(rows, batch_size=CHUNK, ignore_conflicts=True)
        except DatabaseError:  # this process keeps its vectors; the next computes them again
            logger.warning("tool vectors could not be stored", exc_info=True)
        finally:
            _release()


def _release() -> None:
    """Close this thread's connection, unless it is inside a transaction (a test's, say), whose owner does."""
    if not connection.in_atomic_block:
        connection.close()
