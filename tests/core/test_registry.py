import json

import jsonschema
import networkx as nx

from resilibench.core.registry import CATEGORIES, DEPENDENCY_ERROR, default_registry


def test_thirty_tools_six_by_five():
    registry = default_registry()
    assert len(registry) == 30
    assert len(set(registry.names)) == 30
    for category, ops in CATEGORIES.items():
        assert len(ops) == 5
        for op in ops:
            assert f"{category}_{op}" in registry


def test_full_schema_per_tool():
    for tool in default_registry().tools:
        assert tool.canonical_name == tool.name
        assert tool.description
        assert {"INVALID_INPUT", "OPERATION_FAILED", "TIMEOUT"} <= set(tool.error_codes)
        assert DEPENDENCY_ERROR not in tool.error_codes
        names = [r["name"] for r in tool.returns]
        assert "success" in names and "metadata" in names
        assert set(tool.dependency_metadata) >= {"level", "execution_order"}
        assert tool.metadata["category"] == tool.category
        schema = tool.input_schema()
        jsonschema.Draft202012Validator.check_schema(schema)
        assert set(schema["required"]) <= set(schema["properties"])


def test_operation_semantics_of_parameters():
    registry = default_registry()
    assert "source" in {p.name for p in registry["file_operations_reader"].parameters}
    assert {"input_format", "output_format"} <= {p.name for p in registry["data_processing_transformer"].parameters}
    assert "precision" in {p.name for p in registry["computation_calculator"].parameters}
    assert {"timeout", "retry_count"} <= {p.name for p in registry["network_fetcher"].parameters}
    assert {"CALCULATION_ERROR", "OVERFLOW"} <= set(registry["computation_analyzer"].error_codes)
    assert {"NETWORK_ERROR", "RATE_LIMIT_ERROR"} <= set(registry["network_poster"].error_codes)
    assert {"FILE_NOT_FOUND", "PERMISSION_DENIED"} <= set(registry["file_operations_writer"].error_codes)


def test_dependency_graph_is_acyclic_and_follows_role_rules():
    registry = default_registry()
    graph = registry.dependency_graph()
    assert nx.is_directed_acyclic_graph(graph)
    deps = {t.name: set(t.dependencies) for t in registry.tools}
    assert deps["data_processing_transformer"] == {"data_processing_parser"}
    assert deps["computation_analyzer"] == {"data_processing_parser", "data_processing_aggregator"}
    assert deps["computation_calculator"] == {"data_processing_parser", "data_processing_validator"}
    assert deps["file_operations_writer"] == {"data_processing_aggregator"}
    assert deps["file_operations_reader"] == set()
    for tool in registry.tools:  # levels are consistent with the edges
        for d in tool.dependencies:
            assert registry[d].dependency_metadata["level"] < tool.dependency_metadata["level"]


def test_json_export_round_trips_and_validates_inputs():
    registry = default_registry()
    data = json.loads(registry.to_json())
    assert len(data["tools"]) == 30
    assert ["data_processing_parser", "data_processing_transformer"] in data["dependency_edges"]
    schema = data["tools"]["file_operations_reader"]["input_schema"]
    jsonschema.validate({"source": "a.csv"}, schema)
    try:
        jsonschema.validate({}, schema)
    except jsonschema.ValidationError as exc:
        assert "source" in str(exc)
    else:
        raise AssertionError("missing required parameter accepted")


def test_unknown_tool_error_names_it():
    registry = default_registry()
    try:
        registry.id_of("no_such_tool")
    except KeyError as exc:
        assert "no_such_tool" in str(exc)
    else:
        raise AssertionError("unknown tool accepted")
    assert registry.id_of("data_processing_combiner") == registry.id_of("data_processing_aggregator")


def test_check_arguments_names_the_problem():
    registry = default_registry()
    reader = registry.tools[registry.id_of("file_operations_reader")]
    assert reader.check_arguments({"source": "in.csv"}) is None
    assert reader.check_arguments({"source": "in.csv", "options": {"mode": "r"}}) is None
    assert "'source' is a required property" in reader.check_arguments({})
    assert "argument 'source'" in reader.check_arguments({"source": 3})
    assert "'bogus' was unexpected" in reader.check_arguments({"source": "x", "bogus": 1})
    assert "must be a JSON object" in reader.check_arguments(["in.csv"])
    converter = registry.tools[registry.id_of("file_operations_converter")]
    assert "is not one of" in converter.check_arguments(
        {"input_format": "csv", "output_format": "pdf-ish"})
