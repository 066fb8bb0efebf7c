"""The house's shape: every module imports only downward, and the layers stay apart."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Repository folder -> the package it installs as (setup.py's package_dir).
PACKAGES = {'towers': 'towers', 'data': 'towers.data', 'models': 'towers.models'}


def _modules():
    """{module name: path} of every module of the installed packages."""
    modules = {}
    for folder, package in PACKAGES.items():
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith('.py'):
                    path = os.path.join(directory, name)
                    relative = os.path.relpath(path, os.path.join(ROOT, folder))[:-3]
                    dotted = '.'.join([package] + relative.split(os.sep))
                    modules[dotted.removesuffix('.__init__')] = path
    return modules


def _imports(modules):
    """{module: the project's modules it imports}, read off the source (function-level too)."""
    graph = {}
    for name, path in modules.items():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    whole = node.module + '.' + alias.name
                    imported.add(whole if whole in modules else node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(module, path):
        state[module] = 'open'
        for dependency in sorted(graph[module]):
            if state.get(dependency) == 'open':
                return path[path.index(dependency):] + [dependency]
            if dependency not in state:
                found = visit(dependency, path + [dependency])
                if found:
                    return found
        state[module] = 'done'
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_no_module_imports_upward_in_a_cycle():
    graph = _imports(_modules())
    assert len(graph) > 50  # every module was read
    assert _cycle(graph) is None, ' -> '.join(_cycle(graph))


def test_the_core_never_imports_the_tools_or_the_command_line():
    upper = ('towers.tools', 'towers.cli')
    graph = _imports(_modules())
    wrong = {module: sorted(d for d in deps if d.startswith(upper))
             for module, deps in graph.items()
             if not module.startswith(upper) and module != 'towers.__main__'}
    assert {m: d for m, d in wrong.items() if d} == {}
    tools_on_cli = {m: sorted(d for d in deps if d.startswith('towers.cli'))
                    for m, deps in graph.items() if m.startswith('towers.tools')}
    assert {m: d for m, d in tools_on_cli.items() if d} == {}


# Above the core (towers/*.py) and built on it: the inputs and the cluster. The Trainer is
# where they meet (it picks the run's source and cluster), __main__ is the command line's.
ABOVE_THE_CORE = ('towers.inputs', 'towers.cluster')
ASSEMBLERS = ('towers.trainer', 'towers.__main__')


def _core(modules):
    """The core's modules: those of towers/ itself, not of a subpackage, but the assemblers."""
    top = os.path.join(ROOT, 'towers')
    return sorted(name for name, path in modules.items()
                  if os.path.dirname(path) == top and name not in ASSEMBLERS)


def _upward(graph, core):
    """{core module: what it imports of the layers above it}, where it imports any."""
    found = {module: sorted(d for d in graph[module]
                            if any(d == p or d.startswith(p + '.') for p in ABOVE_THE_CORE))
             for module in core}
    return {module: wrong for module, wrong in found.items() if wrong}


def test_the_core_never_imports_the_inputs_or_the_cluster():
    modules = _modules()
    core = _core(modules)
    assert {'towers', 'towers.config', 'towers.graph', 'towers.names'} <= set(core)
    assert _upward(_imports(modules), core) == {}


def test_an_upward_import_is_found_in_a_function_too(tmp_path):
    graph, feed = tmp_path / 'graph.py', tmp_path / 'feed.py'
    graph.write_text('def build():\n    from towers.inputs.feed import FeedInput\n')
    feed.write_text('')
    modules = {'towers.graph': str(graph), 'towers.inputs.feed': str(feed)}
    assert _upward(_imports(modules), ['towers.graph']) == {'towers.graph': ['towers.inputs.feed']}


def test_the_bottom_layer_needs_no_tensorflow():
    modules = _modules()
    for name in ('towers.names', 'towers.config', 'towers.context', 'towers.errors',
                 'towers.cli.parsers', 'towers.cli.flags', 'towers.cli.train_flags',
                 'towers.cli.tool_flags', 'towers.cli.saved_flags', 'towers.cli.cluster_flags',
                 'towers.cli.launcher', 'towers.cluster.launch', 'towers.cluster.forked',
                 'towers.cluster.emulate',
                 'towers.cluster.spec', 'towers.quiet'):
        with open(modules[name], encoding='utf-8') as f:
            tree = ast.parse(f.read())
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = {alias.name for node in top if isinstance(node, ast.Import)
                 for alias in node.names} | {node.module for node in top
                                             if isinstance(node, ast.ImportFrom)}
        assert not {n for n in names if n and n.split('.')[0] == 'tensorflow'}, name


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert _cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) is None
