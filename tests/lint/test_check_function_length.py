"""Tests of scripts/check_function_length.py on small sources written to a
temporary folder: what counts as a function and how long its body is, and
the exit status and report of the command itself."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_function_length.py"
_spec = importlib.util.spec_from_file_location("check_function_length", _SCRIPT)
assert _spec and _spec.loader
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def body(lines: int) -> str:
    """Statements enough for a body of `lines` lines, braces included."""
    return "".join(f"  x += {k};\n" for k in range(lines - 2))


def test_counts_body_lines_from_brace_to_brace():
    src = "int f(int x) {\n" + body(5) + "  return x;\n}\n"
    assert check.functions(src) == [(1, "f", 6)]


def test_multi_line_signature_reports_where_the_declaration_starts():
    src = "// comment\ntemplate <class T>\nstd::vector<T> ns::Foo<T>::Bar(\n    int a,\n    int b) const {\n  return {};\n}\n"
    assert check.functions(src) == [(2, "ns::Foo<T>::Bar", 3)]


def test_lambdas_and_blocks_count_towards_the_enclosing_function():
    src = ("void Outer() {\n"
           "  auto f = [&](int y) {\n" + body(4) + "  };\n"
           "  if (true) {\n    f(1);\n  }\n"
           "  struct Local { int Get() { return 1; } };\n"
           "}\n")
    assert check.functions(src) == [(1, "Outer", 10)]


def test_namespaces_and_classes_are_not_functions_their_members_are():
    src = ("namespace a {\nnamespace {\n"
           "class Foo : public Bar {\n public:\n  Foo() = default;\n"
           "  int Get() const override {\n    return 1;\n  }\n"
           " private:\n  int x_{0};\n  std::vector<int> v_ = {1, 2};\n"
           "  struct Inner {\n    void Run() ABSL_LOCKS_EXCLUDED(mu_) {}\n  };\n"
           "};\n"
           "enum class Kind : int { kA, kB };\n"
           "extern \"C\" {\nint c_fn(void) { return 0; }\n}\n"
           "}  // namespace\n}  // namespace a\n")
    assert check.functions(src) == [(6, "Get", 3), (13, "Run", 1), (18, "c_fn", 1)]


def test_braces_in_strings_comments_and_literals_do_not_count():
    src = ('void f() {\n'
           '  const char* s = "{{ \\" {";  // } {\n'
           '  /* }\n  } */\n'
           "  char c = '{', d = '\\'';\n"
           '  auto r = R"x(})" { )x";\n'
           "  int big = 1'000'000;\n"
           "#define OPEN {\n"
           "}\n"
           "int g() { return '}'; }\n")
    assert check.functions(src) == [(1, "f", 9), (10, "g", 1)]


def test_constructor_initializers_with_braces():
    src = ("Foo::Foo(int a)\n    : a_{a}, b_(a), c_{} {\n  Init();\n}\n"
           "Foo::~Foo() noexcept {}\n")
    assert check.functions(src) == [(1, "Foo::Foo", 3), (5, "Foo::~Foo", 1)]


def test_a_long_initializer_is_not_a_function():
    src = ("const Row kTable[] = {\n" + "".join("  {1, 2},\n" for _ in range(200)) + "};\n"
           "auto kMake = [] {\n  return 1;\n}();\n")
    assert check.functions(src) == [(203, "lambda", 3)]


def test_operators_macros_and_trailing_return_types():
    src = ("bool operator==(const A& a, const A& b) { return true; }\n"
           "auto Sum(int a) -> std::pair<int, int> {\n  return {a, a};\n}\n"
           "TEST(Suite, Case) {\n  EXPECT_TRUE(true);\n}\n"
           "int A::operator()(int x) const& { return x; }\n")
    assert check.functions(src) == [
        (1, "operator==", 1), (2, "Sum", 3), (5, "TEST(Suite, Case)", 3),
        (8, "A::operator()", 1)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_SCRIPT), *args],
                          capture_output=True, text=True, check=False)


def test_command_passes_functions_at_the_limit(tmp_path):
    (tmp_path / "ok.cc").write_text("void At() {\n" + body(10) + "}\n")
    (tmp_path / "notes.txt").write_text("void Ignored() {\n" + body(50) + "}\n")
    result = run("--max-lines", "10", str(tmp_path))
    assert result.returncode == 0, result.stdout
    assert f"1 functions in {tmp_path}, 0 longer than 10 lines" in result.stdout


def test_command_fails_naming_each_long_function(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.cu").write_text(
        "namespace k {\n__global__ void Kernel(float* out) {\n" + body(12) + "}\n}\n")
    (tmp_path / "short.h").write_text("inline int Short() { return 1; }\n")
    result = run("--max-lines", "10", str(tmp_path))
    assert result.returncode == 1
    assert "2 functions" in result.stdout and "1 longer than 10 lines" in result.stdout
    assert f"  {tmp_path / 'sub' / 'long.cu'}:2: Kernel: 12 lines" in result.stdout


def test_default_limit_is_120(tmp_path):
    (tmp_path / "a.cc").write_text("void A() {\n" + body(121) + "}\n"
                                   "void B() {\n" + body(120) + "}\n")
    result = run(str(tmp_path))
    assert result.returncode == 1
    assert ":1: A: 121 lines" in result.stdout and " B:" not in result.stdout
