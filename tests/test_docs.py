"""The documentation stands alone and points at real things: the README is a short entry that
links the documentation, the specification is in docs/, every file and registry the extension
guide names exists, every page is in the site's navigation, every number a page quotes from
a published bundle is the bundle's, and the site shows the docstrings' reST roles as links or
code, never as text."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
PATH_RE = re.compile(r"`([\w./<>-]+/[\w.<>-]*|[\w-]+\.(?:md|yaml|py|smk))`")
"""A backticked repository path: ``gmc/estimators/registry.py``, ``tests/estimators/``, ``config.yaml``."""


def doc_pages() -> list[Path]:
    """Every Markdown page under docs/, not following the link docs/published (the bundles)."""
    pages = []
    for root, dirs, files in os.walk(DOCS):  # os.walk does not follow directory links
        dirs[:] = sorted(d for d in dirs if not (Path(root) / d).is_symlink())
        pages += [Path(root) / f for f in sorted(files) if f.endswith(".md")]
    return pages


def mkdocs_config() -> dict:
    """mkdocs.yml, with any ``!!python/...`` tag (a theme's) read as None."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)


def nav_pages(nav) -> list[str]:
    """Every page a navigation names, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


TASKS = {
    "A new estimator": ("REGISTRY",),
    "A new delay mode": ("DELAY_MODES",),
    "A new benchmark": ("BENCHMARKS",),
    "A new rollout engine": ("ENGINES",),
    "A new figure or table": ("FIGURES", "TABLES"),
    "A new cluster": (),
}
"""Each task of docs/extending.md and the registries it extends."""

REGISTRY_HOMES = {
    "REGISTRY": "gmc/estimators/registry.py",
    "DELAY_MODES": "gmc/rollouts/delays.py",
    "BENCHMARKS": "gmc/tasks/datasets.py",
    "ENGINES": "gmc/rollouts/engines.py",
    "FIGURES": "gmc/results/outputs.py",
    "TABLES": "gmc/results/outputs.py",
}
"""Where each registry is defined."""


def test_every_task_of_the_extension_guide_lists_files_that_hold_its_registry():
    text = (DOCS / "extending.md").read_text()
    paths = {p for p in PATH_RE.findall(text) if "<" not in p}
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"
    sections = re.split(r"\n## \d+\. ", text)[1:]
    assert [s.split("\n", 1)[0] for s in sections] == list(TASKS)
    for section, (task, registries) in zip(sections, TASKS.items()):
        files = [f for f in re.findall(r"`([^`]+)`", section.split("**Files:**", 1)[1]) if "<" not in f]
        assert files and all((REPO / f).exists() for f in files), (task, files)
        for name in registries:  # the registry the task extends is defined in a file it lists
            assert REGISTRY_HOMES[name] in files, f"{task}: {REGISTRY_HOMES[name]} is not among {files}"
            defined = [
                f
                for f in files
                if f.endswith(".py") and re.search(rf"^{name}(: [^=]+)? = ", (REPO / f).read_text(), re.M)
            ]
            assert defined, f"{task}: {name} is defined in none of {files}"
            assert f"`{name}`" in section


def test_the_extension_guide_registers_an_estimator_with_every_declaration():
    section = (DOCS / "extending.md").read_text().split("## 2. ", 1)[0]
    examples = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "Estimator(" in b]
    assert examples, "docs/extending.md shows no Estimator(...) entry"
    for field in ("aggregation=", "on_policy=", "needs_batch_stats=", "mask_denominator="):
        assert field in examples[0], f"the Estimator(...) example leaves out {field}"


def test_the_specification_lives_in_the_repository_with_its_provenance():
    method = (DOCS / "method.md").read_text()
    assert "arXiv [2610.01896]" in method and "arXiv [2508.02833]" in method
    for section in range(1, 8):
        assert f"\n## {section}. " in method
    for doc in [README, *doc_pages()]:
        assert "shared/docs" not in doc.read_text(), doc


def test_the_readme_is_a_short_entry_that_links_the_specification():
    readme = README.read_text()
    lines = readme.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"
    first_paragraph = readme.split("\n\n")[1]  # after the title
    assert "](docs/method.md)" in first_paragraph
    assert "../shared" not in readme
    blocks = re.findall(r"^```bash\n(.*?)^```", readme, re.S | re.M)
    quick_start = [b for b in blocks if re.search(r"^make run +# ", b, re.M) and re.search(r"^make test +# ", b, re.M)]
    assert quick_start, "README.md shows no bash block with `make run` and `make test`, one line each with a comment"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).exists(), f"README.md links {link}, which does not exist"


def test_every_page_is_in_the_navigation():
    config = mkdocs_config()
    assert config["docs_dir"] == "docs"
    nav = nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the navigation twice"
    pages = {p.relative_to(DOCS).as_posix() for p in doc_pages()}
    assert pages - set(nav) == set(), "pages missing from mkdocs.yml's nav"
    assert set(nav) - pages == set(), "mkdocs.yml's nav names pages that do not exist"


def test_the_site_copies_only_the_figures_the_pages_show():
    """docs/published is the bundles; of them the site builds no page and copies only the images a
    page shows (mkdocs.yml's exclude_docs: everything under published/ but those)."""
    assert (DOCS / "published").is_symlink() and (DOCS / "published").resolve() == (REPO / "published").resolve()
    rules = mkdocs_config()["exclude_docs"].split()
    assert "/published/**" in rules
    kept = {rule[len("!/") :] for rule in rules if rule.startswith("!/published/")}
    shown = set()
    for page in doc_pages():
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            target = Path(os.path.relpath(os.path.normpath(page.parent / image), DOCS)).as_posix()
            assert (DOCS / target).exists(), f"{page}: shows {image}, which does not exist"
            if target.startswith("published/"):
                shown.add(target)
    assert shown == kept, f"exclude_docs keeps {sorted(kept - shown)} unshown, leaves out {sorted(shown - kept)}"
    assert all(path.endswith(".png") for path in kept)


BUNDLES = (
    "default",
    "corrections",
    "corrections_long",
    "real_async",
    "mismatch",
    "group_size",
    "gradient_lab",
    "tune",
    "confirm",
)
"""The published bundles: one per preset, each quoted by a page."""


def quoting_docs() -> list[Path]:
    """The README and every page that quotes a bundle."""
    from gmc.results.quotes import quoted_bundles

    return [doc for doc in [README, *doc_pages()] if any(quoted_bundles(doc).values())]


def test_every_number_a_page_quotes_from_a_bundle_is_the_bundles():
    """A page's tables from a bundle are its files verbatim, and every number of its prose about a
    bundle is printed in that bundle (``gmc quote-bundles --check``): none is copied by hand."""
    from gmc.results.quotes import stale_includes, unquoted

    docs = quoting_docs()
    assert README in docs and len(docs) > 1
    problems = [problem for doc in docs for problem in stale_includes(doc) + unquoted(doc)]
    assert problems == []


def test_every_verdict_a_page_gives_a_bundles_difference_is_its_conclusions():
    """Where a page's prose about a bundle calls a quoted difference "resolved", "equivalent", "no
    cost", "inconclusive" or "not resolved", that is the verdict the bundle's
    ``tables/conclusions.md`` gives it (after Holm's adjustment within its family)."""
    from gmc.results.quotes import misjudged

    assert [problem for doc in quoting_docs() for problem in misjudged(doc)] == []


def test_every_published_bundle_is_quoted():
    """Each bundle's numbers are quoted by some page, and its tables included in one."""
    from gmc.results.quotes import quoted_bundles

    numbers, includes = set(), set()
    for doc in quoting_docs():
        quoted = quoted_bundles(doc)
        numbers |= {(doc.parent / path).resolve() for path in quoted["numbers"]}
        includes |= {(doc.parent / path).resolve() for path in quoted["include"]}
    for bundle in BUNDLES:
        home = (REPO / "published" / bundle).resolve()
        assert home in numbers, f"no page quotes numbers from published/{bundle}"
        assert any(home in path.parents for path in includes), f"no page includes a table of published/{bundle}"
    for table in ("default/tables/main.md", "corrections/tables/league.md", "corrections_long/tables/league.md"):
        assert (REPO / "published" / table).resolve() in includes, f"no page includes published/{table}"
    assert "published/default/tables/main.md" in quoted_bundles(README)["include"]


def test_every_module_of_the_package_has_its_api_on_a_reference_page():
    """Each module's public names are listed on the reference page of its subpackage (generated
    from its docstrings by ``::: module``), the top-level modules on the pages their sections name."""
    import gmc

    package = Path(gmc.__file__).parent
    modules = {
        ".".join(p.relative_to(package.parent).with_suffix("").parts)
        for p in package.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }
    documented = {}
    for page in sorted((DOCS / "reference").glob("*.md")):
        for module in re.findall(r"^::: (gmc[\w.]*)$", page.read_text(), re.M):
            documented.setdefault(module, page.name)
    assert sorted(modules - set(documented)) == []
    for module, page in documented.items():
        room = module.split(".")[1]
        if room in ("tasks", "estimators", "policy", "rollouts", "sweep", "results", "theory"):
            assert page == f"{room}.md", (module, page)
        elif room == "run":
            assert page == "run.md", (module, page)


def sphinx_roles():
    """docs/hooks/sphinx_roles.py, the griffe extension of the site's build that turns the
    docstrings' Sphinx roles into links (skips without griffe, which the docs extra installs)."""
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "hooks" / "sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_docstrings_roles_become_links_or_code_spans():
    rewrite = sphinx_roles().rewrite
    targets = {"gmc.x.Foo": "gmc.x.Foo", "Foo.bar": "gmc.x.Foo.bar", ".sub": "gmc.x.sub", "run": "gmc.x.run"}
    text = (
        ":class:`~gmc.x.Foo` has :meth:`Foo.bar`, :py:func:`run()` is in :mod:`.sub`; "
        ":func:`the runner <run>`, :data:`LIMIT`, :func:`!run`, ``:class:`Foo` `` quoted\n"
        "```python\nx = ':attr:`y`'\n```\n:exc:`ValueError`"
    )
    assert rewrite(text, targets.get) == (
        "[`Foo`][gmc.x.Foo] has [`Foo.bar`][gmc.x.Foo.bar], [`run()`][gmc.x.run] is in [`sub`][gmc.x.sub]; "
        "[`the runner`][gmc.x.run], `LIMIT`, `run`, ``:class:`Foo` `` quoted\n"
        "```python\nx = ':attr:`y`'\n```\n`ValueError`"
    )


RAW_ROLE_RE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj):")
"""A reST role as it shows on a page where nothing turned it into a link: ``:class:`` before the
code span of its target."""


def test_the_site_shows_no_raw_rest_role(tmp_path):
    """The site as ``make docs`` builds it (``mkdocs build --strict``, here into a temporary
    folder; skipped without the docs extra) shows no role as text outside code: every role of the
    docstrings the reference pages render is a link or a code span."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    done = subprocess.run(build, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    raw, links = [], 0
    for page in sorted(site.rglob("*.html")):
        html = page.read_text()
        links += len(re.findall(r'<a class="autorefs[^"]*"[^>]*><code>', html))
        prose = re.sub(r"<(pre|code)\b.*?</\1>", lambda code: code[0].replace(":", "\0"), html, flags=re.S)
        raw += [
            f"{page.relative_to(site)}: {html[m.start() - 60 : m.end() + 40]!r}" for m in RAW_ROLE_RE.finditer(prose)
        ]
    assert raw == [], f"{len(raw)} raw roles, first {raw[:5]}"
    assert links, "no docstring role became a link"


RUN_AS_WRITTEN = {
    "snakemake -n --configfile=workflow/presets/paper.yaml",
    "gmc plan-seeds workflow/presets/confirm.yaml published/corrections",
    "gmc plan-memory --preset workflow/presets/paper.yaml --gpu-gib 79.6",
    "gmc report --results published/default",
    "gmc quote-bundles README.md docs/results/*.md --check",
    "gmc theory --out results/theory --quick",
}
"""The documents' examples a test runs as written, in a copy of a fresh clone's files."""

NOT_RUN = {
    r"^make (run|test|install|test-paper-smoke)\b": "installs, or runs a sweep or the test suite (CI runs them)",
    r"^make (report|check-reproduction)\b|^gmc (export-results|publish) --results results\b": "needs make run's results",
    r"^snakemake .*(--cores|--workflow-profile)": "a sweep (tests/e2e run the workflow, tests/sweep its dry runs)",
    r"^gmc (league-figure|publish|mlflow-sync|export-results|report --results published/<)": "names a sweep's results",
    r"^gmc (import-results|report --results elsewhere)": "needs the archive of the export before it",
    r"^gmc theory --out results/theory$": "the full lab, minutes (its --quick form runs)",
    r"^gmc gradient-lab --history": "needs a finished history (tests/theory/test_gradients.py runs the lab on one)",
    r"^gmc train ": "needs the default model (make run builds it)",
    r"^gmc quickstart$": "minutes (make test-install runs it as installed; tests/test_quickstart.py a shortened one)",
    r"^gmc prepare-data": "downloads, or reads a data root a test does not have",
    r"^gmc/ ": "not a command (a folder listing)",
}
"""Every other example, by pattern: what it needs that a test does not have."""


def doc_examples() -> list[tuple[str, str]]:
    """Each command a code block of README.md or a docs page shows: (where, command), the
    ``.venv/bin/`` prefix and a trailing comment removed; ``A && B`` is two commands."""
    found = []
    for page in [README, *doc_pages()]:
        in_block = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                in_block = not in_block
            elif in_block and re.match(r"\s*(\.venv/bin/)?(gmc|make|snakemake)\b", line):
                for command in line.split("#")[0].split("&&"):
                    command = command.strip().removeprefix(".venv/bin/")
                    if command and not command.startswith("source "):
                        found.append((f"{page.relative_to(REPO)}:{number}", command))
    return found


def test_every_example_of_the_docs_is_run_or_says_what_it_needs():
    examples = doc_examples()
    assert len(examples) > 20
    for where, command in examples:
        assert command in RUN_AS_WRITTEN or any(re.search(p, command) for p in NOT_RUN), (
            f"{where}: {command!r} is neither run by a test nor listed with what it needs (tests/test_docs.py)"
        )
    assert RUN_AS_WRITTEN <= {command for _, command in examples}, "an example the test runs is gone from the docs"


SWEEP_LINE = re.compile(r"^[#\s]*(?:Use with: )?((?:\S+/)?snakemake) (.*)$")
"""A sweep command: a line of a code block, or of a preset's header, that runs Snakemake."""


def documented_sweeps() -> list[tuple[str, str, bool]]:
    """Each sweep command of README.md, the docs pages and the presets' headers, as printed:
    (where, command, whether its code block activated the environment before it)."""
    found = []
    for page in [README, *doc_pages(), *sorted((REPO / "workflow" / "presets").glob("*.yaml"))]:
        in_block, activated = page.suffix == ".yaml", False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                in_block, activated = not in_block, False
            elif in_block and "source .venv/bin/activate" in line:
                activated = True
            elif in_block and (m := SWEEP_LINE.match(line)):
                found.append(
                    (f"{page.relative_to(REPO)}:{number}", f"{m[1]} {m[2]}".split("  #")[0].strip(), activated)
                )
    return found


def test_every_documented_sweep_names_its_interpreter_and_real_files():
    """A sweep command runs as printed from a fresh clone: Snakemake from the environment that
    holds gmc (.venv/bin/snakemake, or after activating it; the workflow then puts that
    interpreter first on its jobs' PATH), every preset and profile it names there."""
    sweeps = documented_sweeps()
    assert len(sweeps) >= 10
    for where, command, activated in sweeps:
        assert command.startswith(".venv/bin/snakemake ") or activated, f"{where}: {command!r} names no environment"
        for path in re.findall(r"--(?:configfile|workflow-profile)[= ](\S+)", command):
            assert (REPO / path).exists(), f"{where}: {command!r} names {path}, which does not exist"


def test_getting_started_quotes_the_paper_plans_peak(capsys):
    """The peak getting started gives for the paper preset is the one ``gmc plan-memory`` prints."""
    from gmc.cli import build_parser

    preset = str(REPO / "workflow/presets/paper.yaml")
    args = build_parser().parse_args(["plan-memory", "--preset", preset, "--gpu-gib", "79.6"])
    assert args.func(args) == 0
    peak = re.search(r"fits \(peak ([\d.]+) GiB", capsys.readouterr().out)[1]
    assert f"the plan's peak is {peak} GiB" in (DOCS / "getting-started.md").read_text()


def fresh_clone(folder: Path) -> Path:
    """``folder`` holding what a fresh clone holds, the published bundles copied (a command may
    redraw one), the rest linked."""
    for name in ("Snakefile", "config.yaml", "workflow", "profiles", "README.md", "docs"):
        (folder / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "published", folder / "published")
    return folder


def test_a_documented_sweep_runs_as_printed_without_an_activated_environment(tmp_path):
    """Getting started's sweep of ten seeds, as printed, in a fresh clone whose .venv is this
    interpreter's environment and whose PATH does not hold it, up to its first job (the data
    check, ``python -m gmc prepare-data``): the job finds the interpreter that runs Snakemake."""
    (command,) = [
        c for w, c, _ in documented_sweeps() if w.startswith("docs/getting-started") and "seed: [0, 1, 2" in c
    ]
    fresh_clone(tmp_path)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir)
    done = subprocess.run(
        f"{command} --until prepare_data",
        shell=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = tmp_path / "results10" / "data" / "manifest.json"
    assert json.loads(manifest.read_text())["sets"] == {"synthetic": {"generated": True}}


@pytest.mark.slow
def test_the_python_page_runs_as_written(tmp_path):
    """docs/python.md's examples, one after another as one script in a fresh folder, as the page
    says: each prints what it says and the tables hold both runs."""
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", (DOCS / "python.md").read_text(), re.S | re.M))
    assert code.count("\n") > 40
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "group_size: must be greater than or equal to 2, got 1" in done.stdout
    assert "algo~gmc/delay~2/group~4/seed~0 mean staleness" in done.stdout
    main = (tmp_path / "results" / "python" / "tables" / "main.md").read_text()
    assert "| gmc | 2 | 4 |" in main and "| grpo | 2 | 4 |" in main, main


@pytest.mark.slow
def test_the_cheap_examples_of_the_docs_run_as_written(tmp_path):
    """In a folder holding what a fresh clone holds (:func:`fresh_clone`), with gmc and snakemake
    on the PATH."""
    fresh_clone(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in sorted(RUN_AS_WRITTEN):
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    assert (tmp_path / "results" / "theory" / "claims.csv").exists()
    assert (tmp_path / "published" / "default" / "figures" / "score_vs_delay.pdf").exists()
