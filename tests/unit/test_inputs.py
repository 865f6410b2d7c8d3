"""Inputs bound to the contract (runner/staging/inputs.py, the staging walker, the issuer's binding,
the host policy): the runner-tree-v1 digest and its test vector, the first differing path, the
check of a git checkout against its commit (real repositories made with the git CLI), and the
re-check of input/ after a job. No engine: `runner run` is in test_input_digests.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runner.app import issuer
from runner.contract import SignatureInfo, load_contract, with_digest
from runner.core.errors import ContractError, InputDigestMismatch, PolicyViolation
from runner.planning import policy
from runner.staging import inputs
from runner.staging import jobdir as staging
from tests.support import FAKE_IMAGE_ID, write_contract
from tests.support.inputs import INPUT_CHANGES, add_link

# ------------------------------------------------------------------ the test vector

VECTOR_LISTING = (
    "F 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 a.txt\n"
    "D bin\n"
    "X 299001868fb8c02fd431c336c6d058f5558c5dff5b5af5e6fe04b870a6a9cbba bin/run.sh\n"
    "D d\n"
    "F e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 d-e\n"
    "F 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 d/x\n"
    "D empty\n"
    "L 18b7cb099a9ea3f50ba899b5ba81e0d377a5f3b16f8f6eeb8b3e58cd4692b993 link\n"
)
VECTOR_DIGEST = "sha256:e2acea2123ed61fdd7f55375d237730dfbb8dcb1bac940b820d45dc519e688ec"


def vector_tree(root: Path) -> Path:
    """The README's test vector: a.txt "hello\\n"; bin/run.sh, executable; an empty folder;
    d/x "x" and an empty d-e (so the order is of whole paths: d-e before d/x); a link to
    a.txt."""
    tree = root / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "d").mkdir()
    (tree / "a.txt").write_bytes(b"hello\n")
    (tree / "bin" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (tree / "bin" / "run.sh").chmod(0o755)
    (tree / "d" / "x").write_bytes(b"x")
    (tree / "d-e").write_bytes(b"")
    os.symlink("a.txt", tree / "link")
    return tree


def test_tree_digest_test_vector(tmp_path: Path) -> None:
    vector_tree(tmp_path)
    got = staging.hash_input(tmp_path, "$.repository.path", "tree")
    assert got.entries is not None
    assert inputs.listing(got.entries.values()) == VECTOR_LISTING
    assert got.digest == VECTOR_DIGEST
    # Independently: the digest is sha256 of the listing text; each F line is sha256sum's.
    assert "sha256:" + hashlib.sha256(VECTOR_LISTING.encode()).hexdigest() == VECTOR_DIGEST
    hello = hashlib.sha256(b"hello\n").hexdigest()
    assert f"F {hello} a.txt\n" in VECTOR_LISTING
    assert f"L {hashlib.sha256(b'a.txt').hexdigest()} link\n" in VECTOR_LISTING


def test_single_file_digest_is_sha256sum(tmp_path: Path) -> None:
    (tmp_path / "paper.md").write_bytes(b"a paper\n")
    got = staging.hash_input(tmp_path, "$.paper.path", "./paper.md")
    shown = subprocess.run(
        ["sha256sum", str(tmp_path / "paper.md")], capture_output=True, text=True, check=True
    )
    assert got.digest == "sha256:" + shown.stdout.split()[0]
    assert got.entries is None and got.path == "paper.md"


def test_only_bytes_kinds_links_and_the_owner_x_bit_count(tmp_path: Path) -> None:
    tree = vector_tree(tmp_path)
    (tree / "a.txt").chmod(0o664)
    os.utime(tree / "a.txt", (1, 1))
    assert staging.hash_input(tmp_path, "$.r", "tree").digest == VECTOR_DIGEST
    (tree / "a.txt").chmod(0o744)
    assert staging.hash_input(tmp_path, "$.r", "tree").digest != VECTOR_DIGEST


@pytest.mark.parametrize("name", ["new\nline", "tab\there", "esc\x1b"])
def test_names_that_cannot_be_listed_are_refused(tmp_path: Path, name: str) -> None:
    tree = vector_tree(tmp_path)
    (tree / name).write_bytes(b"")
    with pytest.raises(ContractError, match="control character"):
        staging.hash_input(tmp_path, "$.repository.path", "tree")


def test_a_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    tree = vector_tree(tmp_path)
    with open(os.path.join(os.fsencode(tree), b"caf\xe9"), "wb"):
        pass
    with pytest.raises(ContractError, match="not UTF-8"):
        staging.hash_input(tmp_path, "$.repository.path", "tree")


def test_first_difference_says_how() -> None:
    base = inputs.parse_listing(VECTOR_LISTING)
    a = "a" * 64

    def changed(path: str, entry: inputs.Entry | None) -> dict[str, inputs.Entry]:
        out = {p: e for p, e in base.items() if p != path}
        return out if entry is None else {**out, path: entry}

    cases = {
        "a.txt changed (its bytes differ)": changed("a.txt", inputs.Entry("F", "a.txt", a)),
        "a.txt was removed": changed("a.txt", None),
        "a.txt changed its executable bit": changed(
            "a.txt", inputs.Entry("X", "a.txt", base["a.txt"].sha256)
        ),
        "link is a symbolic link that was retargeted": changed(
            "link", inputs.Entry("L", "link", a)
        ),
        "d-e changed from a file to a symbolic link": changed("d-e", inputs.Entry("L", "d-e", a)),
        "bin/new was added": changed("bin/new", inputs.Entry("F", "bin/new", a)),
    }
    for said, found in cases.items():
        diff = inputs.first_difference(base, found)
        assert diff is not None
        assert f"{diff.path} {diff.what}".startswith(said), (said, diff)
    assert inputs.first_difference(base, dict(base)) is None


@pytest.mark.parametrize(
    "text",
    ["D a", "Q a\n", "F nothex a\n", "D a\nD a\n", "F " + "0" * 64 + " \n"],
)
def test_malformed_listings_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        inputs.parse_listing(text)


def test_listings_file_name() -> None:
    for name in ("task.json", "task.dsse.json", "task.pinned.json", "task.pinned.dsse.json"):
        assert inputs.listings_name(name) == "task.inputs.json"


# ------------------------------------------------------------------ issuer and staging


def _bound(tmp_path: Path, *, link: bool = True) -> Path:
    """The toy contract in ``tmp_path`` (a link data.txt -> labels.txt in its repository),
    its inputs pinned by `runner pin` (no image: the contract has one)."""
    contract = write_contract(tmp_path, FAKE_IMAGE_ID)
    if link:
        add_link(tmp_path)
    issuer.pin(contract)
    return contract


def _stage(contract: Path, job_root: Path) -> list[staging.StagedFile]:
    return staging.stage_inputs(staging.prepare(job_root), load_contract(contract))


def test_pin_binds_the_inputs_and_writes_their_listings(tmp_path: Path) -> None:
    contract = _bound(tmp_path)
    data = json.loads(contract.read_text())
    listings = json.loads((tmp_path / "task.inputs.json").read_text())
    assert listings["format"] == "runner-tree-v1" and listings["schemaVersion"] == "1.0"
    repo = listings["inputs"]["$.repository.path"]
    assert data["repository"]["digest"] == inputs.digest_of(repo.encode())
    assert "L " + hashlib.sha256(b"labels.txt").hexdigest() + " data.txt\n" in repo
    paper = (tmp_path / "paper.md").read_bytes()
    assert data["paper"]["digest"] == "sha256:" + hashlib.sha256(paper).hexdigest()
    files = _stage(contract, tmp_path / "job")
    staged = tmp_path / "job" / "input" / "repository" / "data.txt"
    assert staged.is_symlink() and os.readlink(staged) == "labels.txt"
    (link,) = [f for f in files if f.link]
    assert link.sha256 == hashlib.sha256(b"labels.txt").hexdigest() and link.size == 10
    manifest = json.loads((tmp_path / "job" / "execution" / "input-manifest.json").read_text())
    assert {i["field"]: i["digest"] for i in manifest["inputs"]} == {
        "$.paper.path": data["paper"]["digest"],
        "$.repository.path": data["repository"]["digest"],
    }


@pytest.mark.parametrize("case", INPUT_CHANGES)
def test_a_changed_input_is_refused_naming_the_path(tmp_path: Path, case: str) -> None:
    contract = _bound(tmp_path)
    change, name, said = INPUT_CHANGES[case]
    change(tmp_path)
    with pytest.raises(InputDigestMismatch) as caught:
        _stage(contract, tmp_path / "job")
    message = str(caught.value)
    assert said in message, message
    expected = json.loads(contract.read_text())[name]["digest"]
    assert message.startswith(f"$.{name}.path: ") and f"$.{name}.digest is {expected}" in message
    assert "runner pin" in message  # the hint: re-pin and re-sign if intended


def test_without_its_listing_the_path_cannot_be_named_and_it_says_why(tmp_path: Path) -> None:
    contract = _bound(tmp_path)
    (tmp_path / "repository" / "extra.py").write_text("x = 1\n")
    (tmp_path / "task.inputs.json").unlink()
    missing = re.escape("cannot be named: task.inputs.json does not exist")
    with pytest.raises(InputDigestMismatch, match=missing):
        _stage(contract, tmp_path / "job")
    issuer.pin(contract, output=tmp_path / "x.json")
    # x.inputs.json holds a listing of another version: it is not believed.
    shutil.copy(tmp_path / "x.inputs.json", tmp_path / "task.inputs.json")
    with pytest.raises(InputDigestMismatch, match="from another version of the input"):
        _stage(contract, tmp_path / "job")


def test_sign_binds_checks_and_repins_the_inputs(tmp_path: Path) -> None:
    pair = issuer.keygen(tmp_path / "keys" / "issuer")
    folder = tmp_path / "c"
    folder.mkdir()
    contract = write_contract(folder, FAKE_IMAGE_ID)
    signed = issuer.sign(contract, pair.private_key)
    assert set(signed.inputs) == {"$.paper.digest", "$.repository.digest"}
    assert signed.listings == folder / "task.inputs.json" and signed.listings.exists()
    issuer.pin(contract)  # the bare contract now carries the digests
    again = issuer.sign(contract, pair.private_key)
    assert again.inputs == signed.inputs
    (folder / "repository" / "labels.txt").write_text("changed\n")
    with pytest.raises(InputDigestMismatch, match=re.escape("repository/labels.txt changed")):
        issuer.sign(contract, pair.private_key)
    repinned = issuer.sign(contract, pair.private_key, repin_inputs=True)
    assert repinned.inputs["$.repository.digest"] != signed.inputs["$.repository.digest"]
    assert repinned.inputs["$.paper.digest"] == signed.inputs["$.paper.digest"]
    (tmp_path / "none").mkdir()
    bare = write_contract(tmp_path / "none", FAKE_IMAGE_ID, with_inputs=False)
    no_inputs = issuer.sign(bare, pair.private_key)
    assert no_inputs.inputs == {} and no_inputs.listings is None


def test_digest_without_a_path_is_invalid(tmp_path: Path) -> None:
    contract = write_contract(
        tmp_path,
        FAKE_IMAGE_ID,
        with_inputs=False,
        change=lambda d: d.update(paper={"title": "t", "digest": "sha256:" + "0" * 64}),
    )
    with pytest.raises(ContractError, match=r"\$.paper: .*there is no path"):
        load_contract(contract)


def test_policy_requires_digests_of_signed_contracts_by_default(tmp_path: Path) -> None:
    contract = write_contract(tmp_path, FAKE_IMAGE_ID)
    unsigned = load_contract(contract)
    signed = replace(unsigned, signature=SignatureInfo(("k",), "t", b""))
    now = datetime.now(UTC)
    default = policy.HostPolicy(acceptUnsigned=True)
    policy.check(unsigned, default, now)
    with pytest.raises(PolicyViolation, match=r"(?s)\$.paper.digest: .*runner pin"):
        policy.check(signed, default, now, check_times=False)
    never = default.model_copy(update={"requireInputDigests": "never"})
    policy.check(signed, never, now, check_times=False)
    always = default.model_copy(update={"requireInputDigests": "always"})
    with pytest.raises(PolicyViolation, match=r"\$.paper.digest"):
        policy.check(unsigned, always, now)
    issuer.pin(contract)
    policy.check(load_contract(contract), always, now)


# ------------------------------------------------------------------ after the job


def test_recheck_finds_input_unchanged_then_names_the_first_change(tmp_path: Path) -> None:
    contract = _bound(tmp_path)
    job = staging.prepare(tmp_path / "job")
    staging.stage_inputs(job, load_contract(contract))
    first = staging.recheck_inputs(job)
    assert first.unchanged is True and first.problem is None
    assert [i["field"] for i in first.inputs] == ["$.paper.path", "$.repository.path"]
    os.symlink("/etc/shadow", job.input / "repository" / "a-planted-link")
    (job.input / "repository" / "z-planted").write_text("x")
    later = staging.recheck_inputs(job)
    assert later.unchanged is False
    assert later.problem == (
        "input/repository/a-planted-link was added (it is in input/ after the job, not in what "
        "was staged)"
    )
    (job.input / "repository" / "a-planted-link").unlink()
    (job.input / "repository" / "z-planted").unlink()
    (job.input / "task.json").write_bytes(b"{}")
    assert staging.recheck_inputs(job).problem == "input/task.json changed (its bytes differ)"
    os.unlink(job.input / "task.json")
    os.mkfifo(job.input / "task.json")
    fifo = staging.recheck_inputs(job)
    assert fifo.unchanged is False and "FIFO" in str(fifo.problem)
    (job.record / "input-tree.json").unlink()
    gone = staging.recheck_inputs(job)  # fail closed: what cannot be shown unchanged is not
    assert gone.unchanged is False and "input-tree.json" in str(gone.problem)


# ------------------------------------------------------------------ git


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo.parent),
    }
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout.strip()


def _checkout(tmp_path: Path, *, object_format: str = "sha1") -> tuple[Path, str, str]:
    """The toy contract whose repository is a git checkout of two commits (the second edits
    labels.txt): the contract file, the first commit and the second (checked out)."""
    folder = tmp_path / "c"
    folder.mkdir()
    write_contract(folder, FAKE_IMAGE_ID)
    repo = folder / "repository"
    git(repo, "init", "-q", f"--object-format={object_format}")
    (repo / "tools").mkdir()
    (repo / "tools" / "run.sh").write_text("#!/bin/sh\n")
    (repo / "tools" / "run.sh").chmod(0o755)
    os.symlink("labels.txt", repo / "data.txt")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "labels.txt").write_text("new labels\n")
    git(repo, "commit", "-q", "-am", "two")
    return folder / "task.json", first, git(repo, "rev-parse", "HEAD")


def _with_commit(contract: Path, commit: str) -> Path:
    data = json.loads(contract.read_text())
    data.pop("contractDigest")
    data["repository"]["commit"] = commit
    contract.write_text(json.dumps(with_digest(data)))
    return contract


def test_git_checkout_at_its_commit_passes(tmp_path: Path) -> None:
    contract, _, second = _checkout(tmp_path)
    for commit in (second, second[:7], second.upper()):
        _stage(_with_commit(contract, commit), tmp_path / "job")


def test_git_checkout_at_another_commit_is_refused(tmp_path: Path) -> None:
    contract, first, _ = _checkout(tmp_path)
    said = re.escape("repository/labels.txt differs from the commit")
    with pytest.raises(InputDigestMismatch, match=said):
        _stage(_with_commit(contract, first), tmp_path / "job")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: (r / "evaluate.py").write_text("print(1)\n"), "repository/evaluate.py differs"),
        (lambda r: (r / "notes.txt").write_text("x"), "repository/notes.txt is in the staged tree"),
        (lambda r: (r / "checkpoint.json").unlink(), "repository/checkpoint.json is in the commit"),
        (lambda r: (r / "tools" / "run.sh").chmod(0o644), "repository/tools/run.sh is a file here"),
        (lambda r: (r / "empty").mkdir(), "repository/empty is in the staged tree and not"),
        (
            lambda r: ((r / "data.txt").unlink(), os.symlink("evaluate.py", r / "data.txt")),
            "repository/data.txt differs",
        ),
    ],
)
def test_an_edited_checkout_is_refused_naming_the_path(
    tmp_path: Path, change: Any, said: str
) -> None:
    contract, _, second = _checkout(tmp_path)
    change(contract.parent / "repository")
    with pytest.raises(InputDigestMismatch, match=re.escape(said)):
        _stage(_with_commit(contract, second), tmp_path / "job")


def test_git_commits_that_cannot_be_checked_are_refused(tmp_path: Path) -> None:
    contract, _, second = _checkout(tmp_path)
    with pytest.raises(InputDigestMismatch, match="does not hold commit 0123456"):
        _stage(_with_commit(contract, "0123456"), tmp_path / "job")
    tree = git(contract.parent / "repository", "rev-parse", "HEAD^{tree}")
    with pytest.raises(InputDigestMismatch, match="as a tree, not a commit"):
        _stage(_with_commit(contract, tree), tmp_path / "job")
    hook = contract.parent / "repository" / ".git" / "hooks" / "post-checkout"
    os.symlink("/etc/shadow", hook)
    with pytest.raises(InputDigestMismatch, match=r"a symbolic link inside \.git"):
        _stage(_with_commit(contract, second), tmp_path / "job")
    hook.unlink()
    info = contract.parent / "repository" / ".git" / "objects" / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text("/elsewhere/objects\n")
    with pytest.raises(InputDigestMismatch, match="outside the staged repository"):
        _stage(_with_commit(contract, second), tmp_path / "job")


def test_a_worktree_pointer_is_refused(tmp_path: Path) -> None:
    """A `.git` file (a linked worktree's or a submodule's pointer): the objects are elsewhere,
    not staged, so the commit cannot be checked; refused rather than skipped."""
    contract, _, second = _checkout(tmp_path)
    repo = contract.parent / "repository"
    shutil.rmtree(repo / ".git")
    (repo / ".git").write_text("gitdir: /elsewhere/.git/worktrees/repository\n")
    with pytest.raises(InputDigestMismatch, match="is not a folder"):
        _stage(_with_commit(contract, second), tmp_path / "job")
    (repo / ".git").unlink()  # no .git at all: not a checkout, nothing to check against
    _stage(_with_commit(contract, second), tmp_path / "job")


def test_a_forged_object_is_not_believed(tmp_path: Path) -> None:
    """A loose object whose bytes are another object's: read, hashed, refused."""
    contract, first, second = _checkout(tmp_path)
    objects = contract.parent / "repository" / ".git" / "objects"
    target = objects / second[:2] / second[2:]
    target.chmod(0o644)
    shutil.copy(objects / first[:2] / first[2:], target)
    with pytest.raises(InputDigestMismatch, match="do not hash to it"):
        _stage(_with_commit(contract, second), tmp_path / "job")


def test_a_submodule_is_refused_clearly(tmp_path: Path) -> None:
    contract, first, _ = _checkout(tmp_path)
    repo = contract.parent / "repository"
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{first},vendored")
    git(repo, "commit", "-q", "-m", "submodule")
    head = git(repo, "rev-parse", "HEAD")
    with pytest.raises(InputDigestMismatch, match="vendored is a submodule"):
        _stage(_with_commit(contract, head), tmp_path / "job")


def test_sha256_repository_at_its_commit_passes(tmp_path: Path) -> None:
    contract, first, second = _checkout(tmp_path, object_format="sha256")
    assert len(second) == 64
    _stage(_with_commit(contract, second), tmp_path / "job")
    with pytest.raises(InputDigestMismatch, match=re.escape("labels.txt differs")):
        _stage(_with_commit(contract, first), tmp_path / "job")


def test_a_commit_that_is_not_an_id_is_not_checked(tmp_path: Path) -> None:
    contract, _, _ = _checkout(tmp_path)
    (contract.parent / "repository" / "untracked.txt").write_text("x")
    _stage(_with_commit(contract, "in-tree"), tmp_path / "job")
    assert not inputs.looks_like_commit("in-tree") and inputs.looks_like_commit("abcdef0")


def test_the_runner_stages_only_its_own_names_beside_the_inputs(tmp_path: Path) -> None:
    """``extra`` takes the runner's own names in input/ only (those no input may take), so it
    can never replace a contract's input."""
    contract = _bound(tmp_path, link=False)
    job = staging.prepare(tmp_path / "job")
    with pytest.raises(ValueError, match=re.escape("'paper.md' is not a name the runner writes")):
        staging.stage_inputs(job, load_contract(contract), extra=[("paper.md", b"not it")])
    files = staging.stage_inputs(
        job, load_contract(contract), extra=[("result.schema.json", b"{}")]
    )
    assert "result.schema.json" in {f.path for f in files}
    assert (job.input / "result.schema.json").read_bytes() == b"{}"
