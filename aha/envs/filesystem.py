"""A virtual filesystem: an in-memory tree, six tools, and procedurally generated file tasks judged by whether the
final tree equals the reference tree.

    tasks: move every .txt in "notes" into "archive" | delete every .log in "tmp" | create a file with given text
           | rename a file | copy a file | make a folder (paths and text in quotes, written as the calls write them)
    tools: list_dir, read_file, write_file, mkdir, move, delete
    reward: get_reward() = 1.0 when the tree after the episode equals the reference (files with their contents,
            and folders), else 0.0. progress() is partial credit, for the `progress` reward (aha.rewards): the
            Jaccard index of the changes the task needs and the changes the episode made,
            |need & made| / |need | made|, each change a file (path and text) or folder that one tree holds and
            the other not; 1.0 exactly when the tree equals the reference, a wrong change counts against it. A
            shortcut can still score: deleting the folder of a "delete every .log" task that holds two .log files
            and nothing else scores 2/3, above one of the two deleted (1/2); GRPO on the agent demo found it.

A task row carries its prompt (chat messages) and the task itself (`fs`: the starting tree and the reference);
`reset(fs=...)` builds that tree, so the G episodes of a group start from the same state. Without a task column
`reset` draws one from the train split and returns its instruction (TRL's self-sampling environment).
Train and test are split by a hash of the task's text (aha.data.splits.split_of).
"""

from __future__ import annotations

import posixpath
import random

from ..data.splits import split_of

WORDS = ("plan", "todo", "notes", "draft", "report", "ideas", "list", "log", "memo", "data", "old", "final", "week",
         "day", "home", "work", "trip", "book", "cart", "mail")
LINES = ("buy milk", "call bob", "fix the door", "read a book", "pay rent", "water plants", "send mail", "walk dog",
         "clean desk", "book a trip")


MAX_DEPTH = 32
"""Parts a path may have ("a/b/c" has 3): a folder holds an entry for each of its parents, so depth costs memory."""
MAX_PATH_CHARS = 1024
"""Characters a path may have, after normalising."""
MAX_ENTRIES = 10_000
"""Files and folders a tree may hold in all."""
MAX_TEXT_CHARS = 1_000_000
"""Characters of file text a tree may hold in all."""


class FileTree:
    """Files (path -> text) and folders; paths are relative, "/"-separated, without "." or ".." parts.

    The tools keep a tree within MAX_DEPTH parts and MAX_PATH_CHARS characters a path, MAX_ENTRIES files and
    folders and MAX_TEXT_CHARS characters of text (a few tens of MB at most); a call past a limit is refused."""

    def __init__(self, files: dict[str, str] | None = None, dirs: list[str] | None = None):
        self.files, self.dirs = dict(files or {}), set(dirs or [])
        for path in list(self.files) + list(self.dirs):
            self._add_parents(path)

    @staticmethod
    def norm(path: str) -> str:
        """"./a//b/" -> "a/b"; ".." stops at the top, so no path leaves the tree: "../x" -> "x". A path past the
        limits is refused (ValueError)."""
        path = posixpath.normpath("/" + str(path).strip()).lstrip("/")
        return FileTree.within_limits("" if path == "." else path)

    @staticmethod
    def within_limits(path: str) -> str:
        """`path`, or a ValueError when it is longer than MAX_PATH_CHARS or deeper than MAX_DEPTH."""
        if path.count("/") >= MAX_DEPTH:
            raise ValueError(f"path of {path.count('/') + 1} parts: at most {MAX_DEPTH}")
        if len(path) > MAX_PATH_CHARS:
            raise ValueError(f"path of {len(path)} characters: at most {MAX_PATH_CHARS}")
        return path

    def check_room(self, entries: int = 0, text: int = 0) -> None:
        """Refuse (OSError) `entries` more files or folders, or `text` more characters, past the tree's limits."""
        if len(self.files) + len(self.dirs) + entries > MAX_ENTRIES:
            raise OSError(f"the tree holds {len(self.files) + len(self.dirs)} files and folders: at most {MAX_ENTRIES}")
        held = sum(map(len, self.files.values()))
        if held + text > MAX_TEXT_CHARS:
            raise OSError(f"the tree holds {held} characters of text, and {text} more would pass {MAX_TEXT_CHARS}")

    def file_above(self, path: str) -> str | None:
        """The file that `path` would pass through as a folder ("a.txt" for "a.txt/sub"), or None."""
        parent = posixpath.dirname(path)
        while parent and parent not in self.files:
            parent = posixpath.dirname(parent)
        return parent or None

    def _add_parents(self, path: str) -> None:
        parent = posixpath.dirname(path)
        while parent:
            self.dirs.add(parent)
            parent = posixpath.dirname(parent)

    def is_dir(self, path: str) -> bool:
        return path == "" or path in self.dirs

    def children(self, path: str) -> list[str]:
        """The names directly in folder `path`, folders with a trailing "/"."""
        prefix, out = path + "/" if path else "", set()
        for p in list(self.files) + [d + "/" for d in self.dirs]:
            if p.startswith(prefix) and p != prefix:
                rest = p[len(prefix):]
                out.add(rest.split("/")[0] + ("/" if "/" in rest else ""))
        return sorted(out)

    def state(self) -> tuple:
        """What the reward compares: every file with its text, and every folder."""
        return tuple(sorted(self.files.items())), tuple(sorted(self.dirs))

    def to_dict(self) -> dict:
        return {"files": dict(sorted(self.files.items())), "dirs": sorted(self.dirs)}


class FilesystemEnv:
    """TRL's environment contract over a FileTree (see the module doc)."""

    def reset(self, fs: dict | None = None, **kwargs) -> str | None:
        drawn = fs is None
        if drawn:  # self-sampling: a train task of a family drawn at random
            fs = make_tasks("train", 1, random.randrange(2**31), (random.choice(list(FAMILIES)),))[0]["fs"]
        self.tree, self.goal, self._start = FileTree(**fs["start"]), FileTree(**fs["goal"]), fs["start"]
        return fs["instruction"] if drawn else None

    def get_reward(self) -> float:
        return float(self.tree.state() == self.goal.state())

    def progress(self) -> float:
        """Partial credit (the module doc): |need & made| / |need | made| over the changes from the starting tree
        to the reference (need) and to the tree now (made); 1.0 where neither changes anything."""
        start = FileTree(**self._start)                   # built here, not in every reset: only progress reads it
        need, made = changes(start, self.goal), changes(start, self.tree)
        return len(need & made) / len(need | made) if need | made else 1.0

    def state_key(self) -> tuple:
        """The tree (gigpo's anchor states: with what the episode has read, so a tree before a list_dir is another
        anchor than the same tree after it)."""
        return self.tree.state()

    def list_dir(self, path: str) -> str:
        """
        List a folder (entries as paths; folders end with "/").

        Args:
            path: The folder, e.g. "notes" ("" or "." for the top).

        Returns:
            The entries' paths, one per line.
        """
        path = FileTree.norm(path)
        if not self.tree.is_dir(path):
            raise FileNotFoundError(f"no folder {path}")
        return "\n".join(posixpath.join(path, name) for name in self.tree.children(path)) or "(empty)"

    def read_file(self, path: str) -> str:
        """
        Read a file.

        Args:
            path: The file, e.g. "notes/a.txt".

        Returns:
            Its text.
        """
        path = FileTree.norm(path)
        if path not in self.tree.files:
            raise FileNotFoundError(f"no file {path}")
        return self.tree.files[path]

    def write_file(self, path: str, content: str) -> str:
        """
        Write a file (its folder must exist).

        Args:
            path: The file, e.g. "todo.md".
            content: The text to write.

        Returns:
            "ok".
        """
        path = FileTree.norm(path)
        if not path or self.tree.is_dir(path) or not self.tree.is_dir(posixpath.dirname(path)):
            raise FileNotFoundError(f"cannot write {path}: no such folder, or it is a folder")
        content = str(content)
        self.tree.check_room(path not in self.tree.files, len(content) - len(self.tree.files.get(path, "")))
        self.tree.files[path] = content
        return "ok"

    def mkdir(self, path: str) -> str:
        """
        Make a folder.

        Args:
            path: The folder, e.g. "archive/old".

        Returns:
            "ok".
        """
        path = FileTree.norm(path)
        if not path or path in self.tree.files:
            raise FileExistsError(f"cannot make folder {path!r}")
        if (file := self.tree.file_above(path)) is not None:
            raise NotADirectoryError(f"cannot make folder {path}: {file} is a file")
        self.tree.check_room(path.count("/") + 1)
        self.tree.dirs.add(path)
        self.tree._add_parents(path)
        return "ok"

    def move(self, src: str, dst: str) -> str:
        """
        Move or rename (into dst if it is a folder).

        Args:
            src: What to move, e.g. "notes/a.txt".
            dst: Where to, e.g. "archive" or "archive/b.txt".

        Returns:
            "ok".
        """
        src, dst = FileTree.norm(src), FileTree.norm(dst)
        if src not in self.tree.files and src not in self.tree.dirs:
            raise FileNotFoundError(f"no file or folder {src}")
        if self.tree.is_dir(dst):
            dst = posixpath.join(dst, posixpath.basename(src))
        if dst in self.tree.files or dst in self.tree.dirs or not self.tree.is_dir(posixpath.dirname(dst)):
            raise FileExistsError(f"cannot move to {dst}: it exists, or its folder does not")
        if dst.startswith(src + "/"):
            raise OSError(f"cannot move {src} into itself ({dst})")
        files = [p for p in self.tree.files if p == src or p.startswith(src + "/")]
        dirs = [d for d in self.tree.dirs if d == src or d.startswith(src + "/")]
        for old in files + dirs:  # every new path checked before the tree changes
            FileTree.within_limits(dst + old[len(src):])
        for old in files:
            self.tree.files[dst + old[len(src):]] = self.tree.files.pop(old)
        self.tree.dirs.difference_update(dirs)
        self.tree.dirs.update(dst + old[len(src):] for old in dirs)
        return "ok"

    def delete(self, path: str) -> str:
        """
        Delete a file or folder.

        Args:
            path: The file or folder, e.g. "tmp/a.log".

        Returns:
            "ok".
        """
        path = FileTree.norm(path)
        if path not in self.tree.files and path not in self.tree.dirs:
            raise FileNotFoundError(f"no file or folder {path}")
        for p in [p for p in list(self.tree.files) if p == path or p.startswith(path + "/")]:
            del self.tree.files[p]
        self.tree.dirs -= {d for d in self.tree.dirs if d == path or d.startswith(path + "/")}
        return "ok"


def changes(a: FileTree, b: FileTree) -> set:
    """What one tree holds and the other not: files as (path, text), folders as paths."""
    return set(a.files.items()) ^ set(b.files.items()) | set(a.dirs) ^ set(b.dirs)


# ------------------------------------------------------------------ tasks
def _names(rng: random.Random, k: int, ext: str) -> list[str]:
    return [f"{w}.{ext}" for w in rng.sample(WORDS, k)]


def _move_txt(rng: random.Random) -> tuple[str, dict, list]:
    txt, other = _names(rng, rng.randint(1, 3), "txt"), _names(rng, rng.randint(0, 2), "md")
    files = {f"notes/{n}": rng.choice(LINES) for n in txt + other}
    steps = [("list_dir", {"path": "notes"})] + [("move", {"src": f"notes/{n}", "dst": "archive"}) for n in sorted(txt)]
    return 'Move every .txt file in "notes" into "archive".', {"files": files, "dirs": ["archive"]}, steps


def _delete_logs(rng: random.Random) -> tuple[str, dict, list]:
    logs, keep = _names(rng, rng.randint(1, 3), "log"), _names(rng, rng.randint(0, 2), "txt")
    files = {f"tmp/{n}": rng.choice(LINES) for n in logs + keep}
    steps = [("list_dir", {"path": "tmp"})] + [("delete", {"path": f"tmp/{n}"}) for n in sorted(logs)]
    return 'Delete every .log file in "tmp".', {"files": files, "dirs": []}, steps


def _create(rng: random.Random) -> tuple[str, dict, list]:
    name, text = rng.choice(_names(rng, 3, "md")), "; ".join(rng.sample(LINES, rng.randint(1, 3)))
    return (f'Create "{name}" containing "{text}".', {"files": {}, "dirs": []},
            [("write_file", {"path": name, "content": text})])


def _rename(rng: random.Random) -> tuple[str, dict, list]:
    folder, (a, b) = rng.choice(FOLDERS), _names(rng, 2, rng.choice(("txt", "md")))
    return (f'Rename "{folder}/{a}" to "{folder}/{b}".', {"files": {f"{folder}/{a}": rng.choice(LINES)}, "dirs": []},
            [("move", {"src": f"{folder}/{a}", "dst": f"{folder}/{b}"})])


def _copy(rng: random.Random) -> tuple[str, dict, list]:
    (src, dst), name, text = rng.sample(FOLDERS, 2), _names(rng, 1, rng.choice(("txt", "md")))[0], rng.choice(LINES)
    return (f'Copy "{src}/{name}" into "{dst}".', {"files": {f"{src}/{name}": text}, "dirs": [dst]},
            [("read_file", {"path": f"{src}/{name}"}), ("write_file", {"path": f"{dst}/{name}", "content": text})])


def _mkdir(rng: random.Random) -> tuple[str, dict, list]:
    path = "/".join(rng.sample(WORDS, rng.randint(2, 3)))
    return f'Make a folder "{path}".', {"files": {}, "dirs": []}, [("mkdir", {"path": path})]


FOLDERS = ("notes", "docs", "backup", "work", "inbox")
"""The folders rename and copy tasks use (copy: from one into another that exists)."""
FAMILIES = {"move_txt": _move_txt, "delete_logs": _delete_logs, "create": _create, "rename": _rename,
            "copy": _copy, "mkdir": _mkdir}
"""Task family -> rng -> (instruction, starting tree, the calls that solve it)."""


def solve(start: dict, steps: list) -> tuple[dict, list[tuple[str, dict, str]]]:
    """Run the solving calls on the starting tree: the reference tree, and each call with its result."""
    env = FilesystemEnv()
    env.tree = FileTree(**start)
    results = [(name, args, getattr(env, name)(**args)) for name, args in steps]
    return env.tree.to_dict(), results


TRIES = 1000
"""Draws of a family that may in a row give a task already made (or of the other split) before it counts as used up."""


def make_tasks(split: str, n: int, seed: int = 0, families: tuple[str, ...] = tuple(FAMILIES)) -> list[dict]:
    """n distinct task rows of `split` ("train" or "test", by a hash of the instruction and the starting tree), the
    families in turn (row i is of families[i % len(families)]), so every slice of len(families) rows holds each
    family once: prompt (chat messages), `fs` (instruction, start, goal), `solution` (the solving calls with their
    results: the demonstrations a cold start learns from), `family` and `id`. A family's distinct tasks number
    thousands (the fewest, mkdir and copy: about 6,500 and 7,200 train, 750 and 800 test), so a run may draw its SFT,
    dev and GRPO tasks from one train list without a family running dry; asking more of one than it has is an error."""
    rng, rows, seen = random.Random(f"fs-{seed}-{split}"), [], set()
    while len(rows) < n:
        family = families[len(rows) % len(families)]
        for _ in range(TRIES):
            instruction, start, steps = FAMILIES[family](rng)
            start = FileTree(**start).to_dict()
            key = f"{instruction} {sorted(start['files'].items())}"
            if key not in seen and split_of(key) == split:
                break
        else:
            made = sum(r["family"] == family for r in rows)
            raise ValueError(f"family {family} ran out of distinct {split} tasks at {made} (asked for {n} tasks of "
                             f"{len(families)} families in turn)")
        seen.add(key)
        goal, solution = solve(start, steps)
        rows.append({"prompt": [{"role": "user", "content": instruction}], "id": key, "family": family,
                     "fs": {"instruction": instruction, "start": start, "goal": goal}, "solution": solution})
    return rows
