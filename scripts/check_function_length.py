#!/usr/bin/python3
"""Fails on a C++ or CUDA function body longer than a limit (default 120).

A body's length is its lines from the opening brace to the closing one.
Lambdas, local classes and blocks inside a function count towards the
function around them; namespaces, classes and brace initializers are not
functions (a class's inline member functions are). Comments, string and
character literals and preprocessor lines are blanked first, so the braces
they hold do not count. Prints the number of functions checked, and each one
over the limit as FILE:LINE (where its declaration starts), name and length.

  scripts/check_function_length.py [--max-lines N] FOLDER_OR_FILE ...
"""
import os
import re
import sys

SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp")
RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(')
# What may follow a parameter list before the body: cv and ref qualifiers,
# virt-specifiers, noexcept(...), and annotation macros such as
# ABSL_LOCKS_EXCLUDED(mu_) (TEST(Suite, Name) alone is the declaration).
TRAILING = re.compile(
    r"(?:\s+|\b(?:const|volatile|override|final|noexcept|mutable|constexpr)\b"
    r"|&&?|\bnoexcept\s*\([^()]*\))$")
ANNOTATION = re.compile(r"\b[A-Z][A-Z0-9_]*\s*\([^()]*\)$")
SCOPE = re.compile(r"\b(?:namespace|class|struct|union|enum|extern)\b")
ACCESS = re.compile(r"^(?:\s*(?:public|private|protected)\s*:(?!:))+")
LAMBDA = re.compile(r"(?:^|[=(,]|\breturn)\s*\[[^\[\]]*\]$")


def blank(text):
    """text with comments, literals and preprocessor lines replaced by
    spaces (newlines kept, so line numbers hold); a literal keeps its quotes."""
    out, i, n, line_start = [], 0, len(text), True

    def spaces(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i, line_start = i + 1, True
            continue
        if c in " \t\r\f\v":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # a directive, with its continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                if text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                else:
                    j += 1
            out.append(spaces(text[i:j]))
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(spaces(text[i:j]))
            i = j
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            j = n if end < 0 else end + 2
            out.append(spaces(text[i:j]))
            i = j
            continue
        prev = text[i - 1] if i else " "
        raw = None if (prev.isalnum() or prev == "_") else RAW_STRING.match(text, i)
        if raw:
            end = text.find(")" + raw.group(1) + '"', raw.end())
            j = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('"' + spaces(text[i + 1:j - 1]) + '"')
            i = j
            continue
        if c == "'" and is_digit_separator(text, i):
            out.append(" ")
            i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j, n - 1)
            out.append(c + spaces(text[i + 1:j]) + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def is_digit_separator(text, i):
    """Whether the ' at i sits inside a number, as in 1'000'000."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return j < i and text[j].isdigit()


def matching_open(s, close_at):
    """Index of the ( that pairs with the ) at close_at."""
    depth = 0
    for k in range(close_at, -1, -1):
        if s[k] == ")":
            depth += 1
        elif s[k] == "(":
            depth -= 1
            if depth == 0:
                return k
    return -1


def strip_trailing(head):
    while True:
        shorter = TRAILING.sub("", head)
        if shorter == head:
            macro = ANNOTATION.search(head)
            if macro:
                shorter = strip_trailing(head[:macro.start()])
                if shorter.endswith(")"):
                    return shorter
            return head
        head = shorter


def declarator(head):
    """head up to and including its parameter list, or None where head
    (the text before a {) does not end like a function's declaration."""
    # A constructor's member initializers: cut at the lone ':' after ')'.
    depth = 0
    for k, ch in enumerate(head):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif (ch == ":" and depth == 0 and head[k - 1:k] != ":"
              and head[k + 1:k + 2] != ":"
              and strip_trailing(head[:k]).endswith(")")
              and head.endswith((")", "}"))):
            return strip_trailing(head[:k])
    # A trailing return type: cut at the last '->' outside parentheses.
    depth = 0
    for k in range(len(head) - 1, 0, -1):
        ch = head[k]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
        elif depth == 0 and head[k - 1:k + 1] == "->":
            before = strip_trailing(head[:k - 1])
            if before.endswith(")"):
                return before
    head = strip_trailing(head)
    if head.endswith(")") or LAMBDA.search(head):
        return head
    return None


def function_name(decl):
    if decl.endswith("]"):
        return "lambda"
    start = matching_open(decl, len(decl) - 1)
    before = decl[:start].rstrip()
    op = re.search(r"((?:[\w~]+::)*operator\s*(?:\(\)|[^\w\s(]+|\s\w[\w:\s*&<>]*))$", before)
    if op:
        return re.sub(r"\s+", " ", op.group(1))
    if before.endswith("]"):
        return "lambda"
    name = re.search(r"((?:[\w~]+\s*(?:<[^<>;]*>)?\s*::\s*)*~?\w+)$", before)
    if not name:
        return "?"
    name = re.sub(r"\s+", "", name.group(1))
    if re.fullmatch(r"[A-Z][A-Z0-9_]+", name):  # TEST(Suite, Name) and such
        return name + re.sub(r"\s+", " ", decl[start:])
    return name


def functions(text):
    """(line of the declaration, name, body lines) of each function in text."""
    s = blank(text)
    found, i, n = [], 0, len(s)
    depth = 0  # namespace and class scopes open
    head_start = 0

    def line(at):
        return s.count("\n", 0, at) + 1

    def skip_block(at):
        """Index just past the } that closes the { at `at`."""
        level = 0
        for k in range(at, n):
            if s[k] == "{":
                level += 1
            elif s[k] == "}":
                level -= 1
                if level == 0:
                    return k + 1
        return n

    while i < n:
        c = s[i]
        if c == ";":
            i += 1
            head_start = i
        elif c == "}":
            depth = max(0, depth - 1)
            i += 1
            head_start = i
        elif c == "{":
            head = re.sub(r"\s+", " ", s[head_start:i]).strip()
            head = ACCESS.sub("", head).strip()
            decl = declarator(head)
            if decl is not None:
                end = skip_block(i)
                first = head_start + len(s[head_start:i]) - len(s[head_start:i].lstrip())
                lead = ACCESS.match(s[first:i])
                if lead:
                    first += len(lead.group(0))
                    first += len(s[first:i]) - len(s[first:i].lstrip())
                found.append((line(first), function_name(decl), line(end - 1) - line(i) + 1))
                i = end
                head_start = i
            elif SCOPE.search(head):
                depth += 1
                i += 1
                head_start = i
            else:  # a brace initializer: part of the declaration around it
                i = skip_block(i)
        else:
            i += 1
    return found


def source_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "node_modules")
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    yield os.path.join(root, name)


def main(argv):
    args, limit = argv[1:], 120
    if args[:1] == ["--max-lines"] and len(args) >= 2:
        limit, args = int(args[1]), args[2:]
    if not args or any(a.startswith("-") for a in args):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    checked, long = 0, []
    for path in source_files(args):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line, name, length in functions(f.read()):
                checked += 1
                if length > limit:
                    long.append((path, line, name, length))
    print(f"function length: {checked} functions in {' '.join(args)}, "
          f"{len(long)} longer than {limit} lines")
    for path, line, name, length in long:
        print(f"  {path}:{line}: {name}: {length} lines")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
