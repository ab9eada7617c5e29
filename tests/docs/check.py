#!/usr/bin/env python3
"""The docs against the tree (ctest docs.check; tests/docs/README.md).

    check.py [REPO_ROOT]        (default: two directories above this file)

Reads README.md, docs/*.md and every README.md under tests/ and tools/, and reports, one
line each as FILE:LINE: what is wrong,

  - a repository path that does not exist: a token starting with one of the repository's
    top-level directories (core/, tests/, docs/, ...), in backticks, in a link or in prose;
    braces are expanded and a glob must match at least one file; a trailing ":LINE",
    ":symbol" or "#anchor" and trailing punctuation are not part of the path; a trailing
    "/" asks for a directory. Also a bare project doc name such as DESIGN.md (beside the
    doc, at the top or in docs/) and a "../" path (from the doc's directory);
  - a path of a machine's workspace outside the repository: /work/..., /home/...,
    a worktree or build tree under /tmp or /var/tmp, a "../" path that leaves the
    repository. System paths (/usr, /dev/shm, /proc, /sys, /etc, /run, ...) and files a
    command is told to write under /tmp are fine;
  - a SLIP_* environment variable that code outside tests/ reads but that no table of
    README.md with a "variable" column lists (and a variable such a table lists that
    nothing outside tests/ reads);
  - a make target, in a `make ...` command in backticks or a code block, that the
    Makefile does not have;
  - a citation of a section of docs/DESIGN.md, the doc's name followed by a title in
    double quotes (with a comma, "'s" or a parenthesis between, or nothing), in these docs
    and in the comments of the code (*.h, *.cc, *.c, *.py, *.sh, Makefile, CMakeLists.txt,
    tests/ included), whose title is no heading of docs/DESIGN.md (any level; the heading
    may go on after the title with " (" or ":"). A citation may run over lines (comment
    markers between are skipped); one whose title lies in a code span is an example;
  - in README.md and docs/*.md, a reference to an issue ("issue 13", "(issue #13)",
    "issues 12 and 13"): the docs say what is, not the history of the work.

Exit status 0 when nothing is wrong, 1 otherwise. Python 3 standard library only.
"""

import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys

# The repository's top-level directories, as docs name them: these and whatever other
# directory the top level has (so that a path under a directory that was removed or
# renamed is still recognised as a path).
TOP_DIRS = {"core", "preload", "shm", "verbs", "fabric", "gpudirect", "ncclnet-plugin",
            "tools", "tests", "docs", "scripts", ".ci"}
# Top-level entries that are not the repository's own: build trees, caches.
NOT_SOURCE = re.compile(r"^(build([-.].*)?|\.git|__pycache__|\..*cache)$")

# "shm/tcp", "native/shm": slip-perf compare's ratio columns (one transport's figure over
# another's), which docs quote; not paths. A token is such a ratio when both of its two
# parts are transport names.
TRANSPORT_NAMES = {"tcp", "shm", "shm-native", "native", "verbs", "fabric"}

# SLIP_* variables that code outside tests/ reads but README.md's tables need not list,
# each with the reason (e.g. one a tool sets for the shim and no user sets). Keep it to
# such variables. None at present: every variable read is one a user may set.
INTERNAL_VARIABLES = {
}

# Absolute paths whose first component is a workspace of some machine, never a path a
# user of the installed software has.
# (/root is root's home, which docs of system software name: not one of them.)
WORKSPACE_ROOTS = {"work", "workspace", "home", "Users", "scratch"}
# Under /tmp or /var/tmp, a path is a workspace when one of its components is one of these
# (a build tree, a checkout, a worktree) or the name of a top-level directory of this tree.
WORKSPACE_PART = re.compile(r"^(build([-.].*)?|\.git|wt-.*|.*worktree.*|main)$")

PATH_CHARS = r"(?:[\w.*?+@-]|/|\{[\w.,*/+-]*\})"
ABS_PATH = re.compile(r"(?<![\w.~$/\\{}-])(/[\w.+@-]+(?:/" + PATH_CHARS + r"*)?)")
UP_PATH = re.compile(r"(?<![\w./~$-])((?:\.\./)+" + PATH_CHARS + r"+)")
DOC_NAME = re.compile(r"(?<![\w./$-])([A-Z][A-Z0-9_-]*\.md|Makefile|CMakeLists\.txt)(?![\w-])")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
SLIP_VAR = re.compile(r"SLIP_[A-Z0-9_]*[A-Z0-9]")


class Report:
    def __init__(self, root):
        self.root = root
        self.problems = []

    def add(self, path, line, what):
        problem = f"{os.path.relpath(path, self.root)}:{line}: {what}"
        if problem not in self.problems:
            self.problems.append(problem)


def docs_of(root):
    """README.md, docs/*.md and the README.md files under tests/ and tools/."""
    docs = [os.path.join(root, "README.md")]
    docs += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    for top in ("tests", "tools"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not NOT_SOURCE.match(x))
            if "README.md" in files:
                docs.append(os.path.join(d, "README.md"))
    return [d for d in docs if os.path.isfile(d)]


def top_dirs(root):
    found = {e for e in os.listdir(root)
             if os.path.isdir(os.path.join(root, e)) and not NOT_SOURCE.match(e)}
    return TOP_DIRS | found


def expand_braces(pattern):
    """a/{b,c}.cc -> [a/b.cc, a/c.cc] (nested groups too)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(pattern[:m.start()] + alt + pattern[m.end():])
    return out


def exists(base, rel):
    """Whether rel (braces expanded, globs matching at least one entry) names something
    under base; a trailing '/' asks for a directory. Returns the missing alternative or
    None."""
    want_dir = rel.endswith("/")
    for alt in expand_braces(rel):
        full = os.path.normpath(os.path.join(base, alt))
        if any(c in alt for c in "*?["):
            hits = glob.glob(full)
            if want_dir:
                hits = [h for h in hits if os.path.isdir(h)]
            if not hits:
                return alt
        elif not (os.path.isdir(full) if want_dir else os.path.exists(full)):
            return alt
    return None


def clean_token(tok):
    """Drops what follows a path: sentence punctuation, a dangling brace or quote."""
    while tok and tok[-1] in ".,;:'\")]}" and not tok.endswith(("../", "./")):
        if tok[-1] == "}" and "{" in tok:
            break
        tok = tok[:-1]
    return tok


def inside(root, path):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def check_paths(root, doc, text, report):
    tops = sorted(top_dirs(root), key=len, reverse=True)
    repo_path = re.compile(r"(?<![\w./~$@\\-])(?:\./)?((?:" + "|".join(re.escape(t) for t in tops)
                           + r")/" + PATH_CHARS + r"*)")
    doc_dir = os.path.dirname(doc)
    # Beside a doc below the top, paths under its own subdirectories (progs/, img/).
    local = sorted((e for e in os.listdir(doc_dir) if os.path.isdir(os.path.join(doc_dir, e))
                    and not NOT_SOURCE.match(e) and e not in tops), key=len, reverse=True)
    local_path = re.compile(r"(?<![\w./~$@\\-])((?:" + "|".join(re.escape(t) for t in local)
                            + r")/" + PATH_CHARS + r"*)") if doc_dir != root and local else None
    checked = 0
    for n, line in enumerate(text.splitlines(), 1):
        found = [(root, m) for m in repo_path.finditer(line)]
        if local_path:
            found += [(doc_dir, m) for m in local_path.finditer(line)]
        for base, m in found:
            tok = clean_token(m.group(1))
            parts = tok.split("/")
            if len(parts) == 2 and parts[0] in TRANSPORT_NAMES and parts[1] in TRANSPORT_NAMES:
                continue
            checked += 1
            missing = exists(base, tok)
            if missing is not None:
                what = "matches nothing" if any(c in missing for c in "*?[") else "does not exist"
                if missing != tok:
                    what += f" ({missing})"
                if base != root:
                    what += f" (from {os.path.relpath(base, root)}/)"
                report.add(doc, n, f"`{tok}` {what}")
        for m in UP_PATH.finditer(line):
            tok = clean_token(m.group(1))
            checked += 1
            # From the doc's directory (a link), or from the top (a command run there).
            if inside(root, os.path.join(doc_dir, tok)) and exists(doc_dir, tok) is None:
                continue
            if not inside(root, os.path.join(doc_dir, tok)) or not inside(root, os.path.join(root, tok)):
                report.add(doc, n, f"`{tok}` points outside the repository "
                                   "(a workspace path; name it from the repository's root)")
            else:
                report.add(doc, n, f"`{tok}` does not exist (from {os.path.relpath(doc_dir, root)}/)")
        for m in DOC_NAME.finditer(line):
            name = m.group(1)
            checked += 1
            bases = (doc_dir, root, os.path.join(root, "docs"))
            if not any(os.path.isfile(os.path.join(b, name)) for b in bases):
                report.add(doc, n, f"`{name}` is neither beside this file, at the top nor in docs/")
        for m in ABS_PATH.finditer(line):
            tok = clean_token(m.group(1))
            parts = [p for p in tok.split("/") if p]
            if not parts:
                continue
            checked += 1
            workspace = parts[0] in WORKSPACE_ROOTS
            if parts[0] == "tmp" or parts[:2] == ["var", "tmp"]:
                rest = parts[1:] if parts[0] == "tmp" else parts[2:]
                workspace = any(WORKSPACE_PART.match(p) or p in tops for p in rest)
            if workspace:
                report.add(doc, n, f"`{tok}` is a path in a machine's workspace, outside the "
                                   "repository (name a file of the repository from its root; "
                                   "another tree by a placeholder, e.g. BASE_BUILD)")
    return checked


# --- SLIP_* variables -------------------------------------------------------------------

SHELL_READ = re.compile(r"\$\{(SLIP_[A-Z0-9_]*[A-Z0-9])(?::?[-=?+])")
CODE_EXT = {".cc", ".cpp", ".cxx", ".c", ".h", ".hpp"}
SHELL_EXT = {".sh", ".bash"}


def code_files(root):
    """Every source file of the repository outside tests/ and the build trees."""
    for top in sorted(top_dirs(root) - {"tests", "docs"}):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not NOT_SOURCE.match(x))
            for f in sorted(files):
                yield os.path.join(d, f)


def kind_of(path):
    ext = os.path.splitext(path)[1]
    if ext in CODE_EXT:
        return "c"
    if ext in SHELL_EXT:
        return "sh"
    if ext == ".py":
        return "py"
    if ext == "":
        try:
            with open(path, "rb") as f:
                first = f.readline(200)
        except OSError:
            return None
        if first.startswith(b"#!"):
            return "py" if b"python" in first else "sh"
    return None


def variables_read(root):
    """{name: (file, line)} of the SLIP_* variables code outside tests/ reads: in C and
    C++ a string literal that is exactly the name (getenv("SLIP_X"), the options tables of
    core/config.cc, verbs/options.cc, fabric/options.cc and tools/slip-run.cc); in shell
    a ${SLIP_X:-default} (or -, =, ?, + with or without the colon); in Python a quoted
    name."""
    found = {}
    literal = {"c": re.compile(r'"(' + SLIP_VAR.pattern + r')"'),
               "py": re.compile(r"""["'](""" + SLIP_VAR.pattern + r""")["']"""),
               "sh": SHELL_READ}
    for path in code_files(root):
        kind = kind_of(path)
        if kind is None:
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            if kind == "sh" and line.lstrip().startswith("#"):
                continue
            for m in literal[kind].finditer(line):
                found.setdefault(m.group(1), (path, n))
    return found


def table_variables(readme):
    """({name: line} of the SLIP_* names in the "variable" column of README.md's tables,
    the header line of the table that lists the most)."""
    listed = {}
    rows = {}
    header = None
    with open(readme, encoding="utf-8") as f:
        lines = f.read().splitlines()
    column = None
    in_fence = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        s = line.strip()
        if in_fence or not s.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if column is None:
            heads = [c.lower() for c in cells]
            column = heads.index("variable") if "variable" in heads else -1
            header = n
            continue
        if column < 0 or column >= len(cells) or set(cells[column]) <= set("-: "):
            continue
        for m in re.finditer(r"`(" + SLIP_VAR.pattern + r")`", cells[column]):
            listed.setdefault(m.group(1), n)
            rows[header] = rows.get(header, 0) + 1
    return listed, max(rows, key=rows.get, default=None)


def check_variables(root, report):
    readme = os.path.join(root, "README.md")
    read = variables_read(root)
    listed, table = table_variables(readme)
    if not listed:
        report.add(readme, 1, "no table with a \"variable\" column lists a SLIP_* variable")
    for name, (path, line) in sorted(read.items()):
        if name in listed or name in INTERNAL_VARIABLES:
            continue
        where = f"{os.path.relpath(path, root)}:{line}"
        report.add(readme, table or 1,
                   f"`{name}` (read at {where}) is in no table of variables of README.md")
    for name, line in sorted(listed.items(), key=lambda kv: kv[1]):
        if name not in read:
            report.add(readme, line, f"`{name}` is in the table of variables but nothing "
                                     "outside tests/ reads it")
    for name in sorted(INTERNAL_VARIABLES):
        if name not in read:
            report.add(__file__, 1, f"INTERNAL_VARIABLES names `{name}`, which nothing reads")
    return len(read)


# --- citations of docs/DESIGN.md, issue references -------------------------------------

DESIGN_DOC = os.path.join("docs", "DESIGN.md")
# The doc's name (backticks around it or not), then ", ", "'s ", " (" or a space, then the
# title in double quotes. Matched in text whose line breaks (and comment markers) became
# spaces.
CITATION = re.compile(r"(?<![\w-])DESIGN\.md`?(?:'s)?\s*,?\s*\(?\s*\"([^\"]{1,200})\"")
# What starts a comment line, removed before a citation's lines are joined.
COMMENT_LEAD = re.compile(r"^\s*(?://+!?|/\*+|\*+(?!/)|#+!?|--)?\s?")
CITING_EXT = CODE_EXT | SHELL_EXT | {".py"}
CITING_NAMES = {"Makefile", "CMakeLists.txt"}
ISSUE = re.compile(r"(?i)(?<![\w/-])issues?\s+#?\d+")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def normal(title):
    return " ".join(title.replace("`", "").split())


def design_headings(root):
    """The headings of docs/DESIGN.md (any level, outside code blocks), normalised; None
    when there is no such doc."""
    path = os.path.join(root, DESIGN_DOC)
    if not os.path.isfile(path):
        return None
    headings = set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            m = HEADING.match(line)
            if m and not in_fence:
                headings.add(normal(m.group(2)))
    return headings


def names_heading(title, headings):
    """Whether `title` is a heading, or a heading that goes on with " (" or ":"."""
    t = normal(title)
    return t in headings or any(h.startswith((t + " (", t + ":")) for h in headings)


def citing_files(root, docs):
    """The docs, then every code file of the tree (build trees aside) but this one."""
    files = list(docs)
    me = os.path.realpath(__file__)
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not NOT_SOURCE.match(x))
        for name in sorted(names):
            path = os.path.join(d, name)
            if (os.path.splitext(name)[1] in CITING_EXT or name in CITING_NAMES) \
                    and os.path.realpath(path) != me:
                files.append(path)
    return files


def joined(path, text):
    """The text with its lines joined by spaces (a code file's comment markers removed, a
    doc's code spans that hold a quote blanked: examples), and where each line starts."""
    lines = text.splitlines()
    if path.endswith(".md"):
        body = "\n".join(lines)
        body = SPAN.sub(lambda m: " " * len(m.group(0)) if '"' in m.group(2) else m.group(0),
                        body)
        lines = body.split("\n")
    else:
        lines = [COMMENT_LEAD.sub("", line, count=1) for line in lines]
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    return " ".join(lines), starts


def line_of(starts, offset):
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def check_citations(root, docs, report):
    headings = design_headings(root)
    checked = 0
    for path in citing_files(root, docs):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if "DESIGN.md" not in text:
            continue
        flat, starts = joined(path, text)
        for m in CITATION.finditer(flat):
            checked += 1
            title = normal(m.group(1))
            if headings is None:
                report.add(path, line_of(starts, m.start()),
                           f'cites {DESIGN_DOC}, "{title}", and there is no {DESIGN_DOC}')
            elif not names_heading(title, headings):
                report.add(path, line_of(starts, m.start()),
                           f'cites {DESIGN_DOC}, "{title}", which is no heading of it '
                           "(name one, or the part of one before its \" (\" or \":\")")
    return checked


def check_issues(root, doc, text, report):
    """Issue references in README.md and docs/*.md."""
    rel = os.path.relpath(doc, root)
    if rel != "README.md" and os.path.dirname(rel) != "docs":
        return
    for m in ISSUE.finditer(text):
        n = text.count("\n", 0, m.start()) + 1
        ref = " ".join(m.group(0).split())
        report.add(doc, n, f'"{ref}": a reference to an issue (say what is true now; the '
                           "history of the work belongs to the issues themselves)")


# --- make targets -----------------------------------------------------------------------

def make_targets(root):
    """The Makefile's targets and pattern rules: from make's own database (make -pq with
    the goal .DEFAULT, which runs no recipe), or, without make, from its rule lines."""
    makefile = os.path.join(root, "Makefile")
    make = shutil.which("make")
    if make:
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS")}
        out = subprocess.run([make, "-C", root, "-f", makefile, "-pq", "-R", ".DEFAULT"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, env=env, text=True, timeout=60).stdout
        return parse_database(out)
    return parse_makefile(makefile)


def parse_database(out):
    """Names of the entries of make's database ("# Files", and "# Implicit Rules" for
    pattern rules) but those marked "# Not a target:" and special ones (.PHONY, ...)."""
    targets = set()
    lines = out.splitlines()
    section = False
    for i, line in enumerate(lines):
        if line.startswith("# "):
            if line.startswith(("# Files", "# Implicit Rules")):
                section = True
            elif line.startswith(("# files hash", "# Finished", "# VPATH", "# Pattern-specific",
                                  "# Variables", "# Directories", "# No implicit")):
                section = False
            continue
        if not section or not line or line[0] in "#\t ":
            continue
        if i > 0 and lines[i - 1] == "# Not a target:":
            continue
        m = re.match(r"^([^:=]+?):(?![=:])", line)
        if m:
            targets.update(t for t in m.group(1).split() if not t.startswith("."))
    return targets


def parse_makefile(makefile):
    targets = set()
    with open(makefile, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.match(r"^([^\s#:=][^:=]*?)\s*:(?![=:])", line)
        if m and not m.group(1).startswith(("export ", "override ")):
            targets.update(t for t in m.group(1).split() if not t.startswith("."))
    return targets


def target_known(target, targets):
    if target in targets:
        return True
    return any("%" in t and fnmatch.fnmatchcase(target, t.replace("%", "*")) for t in targets)


def code_of(text):
    """(line, code) for every inline code span and every line of a fenced or indented
    code block."""
    out = []
    prose = []
    in_fence = False
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            prose.append("")
            continue
        if in_fence or (line.startswith("    ") and (n == 1 or not lines[n - 2].strip()
                                                  or lines[n - 2].startswith("    "))
                        and not line.lstrip().startswith(("|", "-", "*"))):
            out.append((n, line))
            prose.append("")
        else:
            prose.append(line)
    body = "\n".join(prose)
    for para in re.finditer(r"(?:[^\n]+\n?)+", body):
        for m in SPAN.finditer(para.group(0)):
            start = para.start() + m.start(2)
            out.append((body.count("\n", 0, start) + 1, m.group(2)))
    return out


def make_goals(code):
    """The goals of each `make ...` command in a piece of code, or [] (a make of another
    directory or file is not this Makefile's)."""
    goals = []
    for cmd in re.split(r"&&|\|\||[;|()\n]", code):
        words = cmd.split("#", 1)[0].split()
        while words and (words[0] in ("$", "sudo", "env") or re.match(r"^\w+=", words[0])):
            words.pop(0)
        if not words or words[0] != "make":
            continue
        words.pop(0)
        mine = []
        other = False
        while words:
            w = words[0]
            if w in ("-j", "-l") and len(words) > 1 and re.match(r"^[0-9.]+$", words[1]):
                words = words[2:]
            elif w in ("-C", "-f", "--directory", "--file", "--makefile", "-o", "-W"):
                if w in ("-C", "-f", "--directory", "--file", "--makefile"):
                    other = other or (len(words) > 1 and words[1] not in (".", "Makefile"))
                words = words[2:]
            elif w.startswith("-") or re.match(r"^\w+=", w):
                words.pop(0)
            elif re.match(r"^[A-Za-z0-9_.%/-]+$", w):
                # Not .PHONY, "...", or a placeholder such as TARGET.
                if not w.startswith(".") and not re.match(r"^[A-Z][A-Z0-9_]*$", w):
                    mine.append(w)
                words.pop(0)
            else:
                break
        if not other:
            goals += mine
    return goals


def check_make(root, doc, text, targets, report):
    checked = 0
    for n, code in code_of(text):
        for goal in make_goals(code):
            checked += 1
            if not target_known(goal, targets):
                report.add(doc, n, f"`make {goal}`: the Makefile has no target {goal}")
    return checked


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    report = Report(root)
    targets = make_targets(root)
    if not targets:
        report.add(os.path.join(root, "Makefile"), 1, "no targets found")
    docs = docs_of(root)
    paths = goals = 0
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        paths += check_paths(root, doc, text, report)
        goals += check_make(root, doc, text, targets, report)
        check_issues(root, doc, text, report)
    variables = check_variables(root, report)
    citations = check_citations(root, docs, report)
    order = {os.path.relpath(d, root): i for i, d in enumerate(docs)}

    def position(problem):
        path, line = problem.split(":", 2)[:2]
        return order.get(path, len(order)), path, int(line)

    for p in sorted(report.problems, key=position):
        print(p)
    summary = (f"{len(docs)} docs: {paths} paths, {goals} make targets; {variables} SLIP_* "
               f"variables read outside tests/; {citations} citations of {DESIGN_DOC}")
    if report.problems:
        print(f"docs.check: {len(report.problems)} problems ({summary})")
        return 1
    print(f"docs.check: OK ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
