"""Code mode's pure parts: bindings, TypeScript declarations (checked by `deno check` against real servers'
schemas) and tool search."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from deno import find_deno_bin

from handoff.codemode.bindings import bindings_build, camel_case
from handoff.codemode.embeddings import encoder
from handoff.codemode.search import Embedder, SearchIndex, stem, terms
from handoff.codemode.typescript import declarations, input_type, method_declaration
from handoff.codemode.vectors import StoredVectors

CATALOGS = Path(__file__).resolve().parents[3] / "bench" / "catalogs"


def real_tools() -> list[tuple[str, str, str, dict]]:
    """(exposed name, slug, tool name, definition) of every tool in the real catalogs."""
    found = []
    for path in sorted(CATALOGS.glob("*.json")):
        for tool in json.loads(path.read_text())["tools"]:
            found.append((f"{path.stem}__{tool['name']}", path.stem, tool["name"], tool))
    return found


@pytest.mark.parametrize(
    ("name", "method"),
    [("list_commits", "listCommits"), ("list-commits", "listCommits"), ("list.commits", "listCommits"),
     ("getCurrentTime", "getCurrentTime"), ("API-get-user", "APIGetUser"), ("echo", "echo"),
     ("__private_", "private")],
)  # fmt: skip
def test_tool_names_become_camel_case_methods(name, method):
    assert camel_case(name) == method


def test_bindings_map_each_path_back_to_its_exposed_name():
    bindings = bindings_build(
        [("my-gh__list_commits", "my-gh", "list_commits"), ("time__get_time", "time", "get_time")]
    )
    assert bindings.by_path[("myGh", "listCommits")].exposed_name == "my-gh__list_commits"
    assert bindings.by_name["time__get_time"].path == "tools.time.getTime"
    assert bindings.tree() == {"myGh": {"listCommits": "my-gh__list_commits"}, "time": {"getTime": "time__get_time"}}


def test_unsafe_and_colliding_names_are_refused_with_a_reason():
    bindings = bindings_build(
        [
            ("x__then", "x", "then"),
            ("x__constructor", "x", "constructor"),
            ("x__2fa", "x", "2fa"),
            ("x__list_items", "x", "list_items"),
            ("x__listItems", "x", "listItems"),
            ("x__fine", "x", "fine"),
            ("a-1__t", "a-1", "t"),
            ("a1__t", "a1", "t"),
        ]
    )
    assert set(bindings.by_name) == {"x__fine"}
    assert bindings.refused == {
        "x__then": "'then' is a name JavaScript objects reserve",
        "x__constructor": "'constructor' is a name JavaScript objects reserve",
        "x__2fa": "'2fa' is not a JavaScript identifier",
        "x__list_items": "x.listItems would stand for several tools: x__listItems, x__list_items",
        "x__listItems": "x.listItems would stand for several tools: x__listItems, x__list_items",
        "a-1__t": "namespace 'a1' would stand for several upstreams",
        "a1__t": "namespace 'a1' would stand for several upstreams",
    }


def test_only_keeps_the_bindings_a_caller_may_use():
    bindings = bindings_build([("t__a", "t", "a"), ("t__b", "t", "b")]).only(lambda name: name == "t__b")
    assert bindings.tree() == {"t": {"b": "t__b"}} and ("t", "a") not in bindings.by_path


@pytest.mark.parametrize(
    ("schema", "typescript"),
    [
        ({"type": "string"}, "string"),
        ({"type": "integer"}, "number"),
        ({"type": ["string", "null"]}, "string | null"),
        ({"type": "string", "nullable": True}, "string | null"),
        ({"enum": ["a", "b", 3]}, '"a" | "b" | 3'),
        ({"const": "fixed"}, '"fixed"'),
        ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}}, "(string | number)[]"),
        ({"type": "object"}, "Record<string, unknown>"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, "Record<string, number>"),
        ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}]},
         "{\n  a: string;\n}"),
        ({"type": "object", "properties": {"x-y": {"type": "boolean", "description": "ends */ here"}}},
         '{\n  /** ends *\\/ here */\n  "x-y"?: boolean;\n}'),
        ({"$ref": "#/$defs/Id", "$defs": {"Id": {"type": "integer"}}}, "number"),
        ({"type": "object", "properties": {"n": {"$ref": "#/definitions/N"}}, "definitions": {"N": {"type": "null"}}},
         "{\n  n?: null;\n}"),
        ({"type": "madeup"}, "unknown"),
    ],
)  # fmt: skip
def test_json_schemas_become_typescript_types(schema, typescript):
    assert input_type(schema) == typescript


def test_a_method_declaration_carries_the_description_and_the_output_type():
    definition = {
        "description": "Add two numbers.",
        "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]},
        "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]},
    }
    assert method_declaration("add", definition, "digest") == (
        "/** Add two numbers. */\nadd(args: {\n  a: number;\n}): Promise<{\n  sum: number;\n}>;"
    )
    no_required = {"inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}}}
    assert method_declaration("maybe", no_required, "other").startswith("maybe(args?: {")


def deno_check(tmp_path: Path, usage: str) -> subprocess.CompletedProcess:
    tools = real_tools()
    bindings = bindings_build([(name, slug, tool) for name, slug, tool, _ in tools])
    assert not bindings.refused, "every real tool name makes a binding"
    (tmp_path / "tools.d.ts").write_text(declarations([(bindings.by_name[n], d, n) for n, _, _, d in tools]))
    (tmp_path / "usage.ts").write_text(f'/// <reference path="./tools.d.ts" />\n{usage}\n')
    command = [find_deno_bin(), "check", "--no-config", "--no-lock", "--no-npm", "--no-remote", "usage.ts"]
    env = {"DENO_DIR": str(tmp_path / "deno"), "DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_declarations_of_real_servers_schemas_type_check_with_deno(tmp_path):
    usage = """
        const now = await tools.time.getCurrentTime({ timezone: "Asia/Tokyo" });
        const commits = await tools.github.listCommits({ owner: "o", repo: "r", page: 2 });
        await tools.filesystem.readTextFile({ path: "/x", head: 10 });
        await tools.kubernetes.kubectlGet({ resourceType: "pods", namespace: "default" });
        try { await tools.notion.APIPostSearch({ query: "plans" }); }
        catch (e) { if (e instanceof MCPToolError) console.log(e.code, e.tool); }
    """
    checked = deno_check(tmp_path, usage)
    assert checked.returncode == 0, checked.stderr
    assert len(real_tools()) >= 300, "the catalogs hold several hundred tools"


def test_deno_check_refuses_code_that_misuses_a_declared_tool(tmp_path):
    checked = deno_check(tmp_path, "await tools.time.getCurrentTime({ timezone: 5 });\nawait tools.time.nope();")
    assert checked.returncode != 0
    assert "Type 'number' is not assignable to type 'string'" in checked.stderr
    assert "Property 'nope' does not exist" in checked.stderr


def test_words_are_split_and_stemmed_alike_in_names_and_queries():
    assert terms("listCommits") == terms("list_commits") == terms("List the commits") == ["list", "commit"]
    assert {stem(word) for word in ("stage", "staged", "staging", "stages")} == {"stag"}


def test_search_ranks_by_name_first_and_returns_only_what_is_allowed():
    index = SearchIndex(
        [
            {"name": "git__git_log", "description": "Shows the commit logs"},
            {"name": "gh__list_commits", "description": "Get list of commits of a branch in a GitHub repository"},
            {"name": "fs__read_file", "description": "Read a file"},
        ]
    )
    assert index.search("list commits", 3, lambda name: True)[:2] == [
        "gh__list_commits",
        "git__git_log",
    ]
    assert index.search("list commits", 3, lambda name: name != "gh__list_commits") == ["git__git_log"]
    assert index.search("nothing matches zzz", 3, lambda name: True) == []


@pytest.fixture(scope="module")
def evaluation() -> tuple[SearchIndex, list[dict]]:
    """The evaluation set (bench/search_eval.json) and an index of the real catalogs, embedded."""
    queries = json.loads((CATALOGS.parent / "search_eval.json").read_text())["queries"]
    index = SearchIndex([definition | {"name": name} for name, _, _, definition in real_tools()])
    embedder = Embedder()
    embedder.fill(index)  # in this thread: the test wants the vectors now
    return index, [q | {"vector": embedder.query(q["query"])} for q in queries]


@pytest.mark.parametrize(("ranking", "floor"), [("lexical", 0.93), ("lexical+semantic", 0.96)])
def test_search_finds_the_expected_tools_in_the_first_five_for_the_evaluation_queries(evaluation, ranking, floor):
    """recall@5 stays at what bench/code_mode.py measured (docs/benchmarks.md), so a change that hurts
    ranking fails here."""
    index, queries = evaluation
    shares = []
    for query in queries:
        vector = query["vector"] if ranking == "lexical+semantic" else None
        found = set(index.search(query["query"], 5, lambda name: True, vector))
        shares.append(len(found & set(query["expected"])) / min(5, len(query["expected"])))
    assert sum(shares) / len(shares) >= floor


def test_meaning_finds_what_words_alone_miss(evaluation):
    index, queries = evaluation
    [folder] = [q for q in queries if q["query"] == "make a new folder"]
    lexical = index.search(folder["query"], 5, lambda name: True)
    combined = index.search(folder["query"], 5, lambda name: True, folder["vector"])
    assert "filesystem__create_directory" not in lexical
    assert "filesystem__create_directory" in combined


def test_the_tokenizer_gives_the_models_own_word_pieces():
    """Ids from the Hugging Face tokenizer that ships with the model (tokenizers 0.23, its tokenizer.json)."""
    pieces = encoder().tokenizer
    assert pieces.encode("Héllo, WORLD! list_commits(repo) naïve café 東京 x\u200by") == [
        101, 7592, 1010, 2088, 999, 2862, 1035, 27791, 1006, 16360, 2080, 1007, 15743, 7668, 1879, 1755, 1060,
        2100, 102,
    ]  # fmt: skip
    assert pieces.encode("make a new folder") == [101, 2191, 1037, 2047, 19622, 102]


def test_the_numpy_encoder_gives_the_reference_embeddings():
    """Reference: sentence-transformers 5 on torch 2.13 (CPU) with the same package's model, computed once
    outside the suite (neither is a dependency of the gateway)."""
    vectors = encoder().embed(["make a new folder", "Create a new directory or ensure a directory exists.",
                               "search CRM contacts and companies"])  # fmt: skip
    reference_first = [-0.014659, -0.102211, -0.038325, 0.022826, 0.060853, -0.043632]
    reference_third = [-0.018078, -0.065146, -0.026842, 0.011917, 0.003435, 0.02221]
    assert np.allclose(vectors[0][:6], reference_first, atol=1e-5)
    assert np.allclose(vectors[2][:6], reference_third, atol=1e-5)
    assert float(vectors[0] @ vectors[1]) == pytest.approx(0.588842, abs=1e-5)
    assert float(vectors[0] @ vectors[2]) == pytest.approx(0.055429, abs=1e-5)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_what_one_process_embedded_the_next_loads_from_the_database(db):
    tools = [
        {"name": "files__read_file", "description": "Read a file from disk. Large files are cut."},
        {"name": "git__git_log", "description": "Show the commit history of a repository."},
    ]
    first = SearchIndex(tools)
    assert Embedder(StoredVectors("model-a")).fill(first) == 2
    later = SearchIndex(tools + [{"name": "files__stat", "description": "Size and dates of a file."}])
    assert Embedder(StoredVectors("model-a")).fill(later) == 1, "a fresh process embeds only the new tool"
    assert np.array_equal(later.vectors[:2], first.vectors)
    assert Embedder(StoredVectors("model-b")).fill(SearchIndex(tools)) == 2, "vectors belong to their model"
