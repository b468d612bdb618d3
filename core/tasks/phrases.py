"""Phrase banks of world v1's task descriptions: what each tool's step achieves, in words that name no tool.

Every tool has several interchangeable clauses (imperative, lower case, slots in braces), and each task
type has several openings and closings, so one required-tool list reads many ways and a description does
not give its tool list away. ``resilibench.core.tasks.generator_v1`` fills the slots; a test checks that no
clause names a tool, an alias or a tool name written with spaces.
"""

from __future__ import annotations

__all__ = [
    "STEP_CLAUSES", "OPENINGS", "SOURCE_SENTENCES", "CLOSINGS", "SENTENCE_CONNECTORS", "FIRST_WORDS",
    "LAST_WORDS", "DATASETS", "FORMATS", "SCHEMAS", "GROUPS", "CONDITIONS", "METRICS", "TEAMS", "HORIZONS",
    "PERIODS", "PRECISIONS",
]

STEP_CLAUSES: dict[str, tuple[str, ...]] = {
    "data_processing_parser": (
        "turn the raw {fmt} content into structured records",
        "break the incoming text into typed fields",
        "decode the payload so that every record has named columns",
    ),
    "data_processing_transformer": (
        "reshape the records into the {out_fmt} layout",
        "restructure each record for the downstream system",
        "convert the field layout so that nested values become flat columns",
    ),
    "data_processing_validator": (
        "check every record against the {schema} schema and reject violations",
        "make sure that each row satisfies the {schema} rules",
        "confirm that required fields are present and well typed",
    ),
    "data_processing_aggregator": (
        "combine the records into a summary per {group}",
        "merge the partial results into one consolidated table",
        "roll the rows up into totals grouped by {group}",
    ),
    "data_processing_filter": (
        "keep only the {condition}",
        "drop everything except the {condition}",
        "select the subset of rows that are {condition}",
    ),
    "file_operations_reader": (
        "load the {dataset} from {source}",
        "open {source} and read the {dataset} it holds",
        "get the contents of {source}",
    ),
    "file_operations_writer": (
        "save the result to {dest}",
        "store the final output as {dest}",
        "persist the outcome on disk at {dest}",
    ),
    "file_operations_scanner": (
        "look through the directory of {source} for every {dataset} file",
        "discover which {fmt} files exist next to {source}",
        "list the files that hold {dataset} under the folder of {source}",
    ),
    "file_operations_compressor": (
        "pack the output into a compact archive",
        "shrink the files with gzip before they move on",
        "bundle the results into a single zip archive",
    ),
    "file_operations_converter": (
        "change the file from {fmt} to {out_fmt}",
        "re-encode the document as {out_fmt}",
        "produce a {out_fmt} copy of the {fmt} file",
    ),
    "network_fetcher": (
        "download the {dataset} from {source}",
        "request the {dataset} over HTTP from {source}",
        "pull the latest {dataset} from the remote endpoint {source}",
    ),
    "network_poster": (
        "send the result to the endpoint {dest_url}",
        "upload the outcome with an HTTP POST to {dest_url}",
        "deliver the payload to the remote service at {dest_url}",
    ),
    "network_monitor": (
        "confirm that the remote service is up and responding",
        "watch the health of the service while the job runs",
        "check the availability and latency of the endpoint",
    ),
    "network_validator": (
        "verify that the HTTP response is well formed and complete",
        "check the status code and the headers of the reply",
        "make sure the returned payload matches the API contract",
    ),
    "network_router": (
        "direct each request to the right regional endpoint",
        "pick the route that each message should travel",
        "forward the traffic to the backup gateway when the primary is busy",
    ),
    "computation_calculator": (
        "work out the {metric}",
        "compute the exact {metric} to {precision} decimal places",
        "evaluate the formula that yields the {metric}",
    ),
    "computation_analyzer": (
        "study the figures for trends and outliers",
        "derive descriptive statistics and notable patterns",
        "examine the distribution of the {metric} and explain what stands out",
    ),
    "computation_optimizer": (
        "tune the parameters so that the {metric} is as good as possible",
        "search for the settings that minimise the cost",
        "find the best allocation under the given budget",
    ),
    "computation_simulator": (
        "run a what-if model of the process over the next {horizon}",
        "play the scenario forward step by step",
        "model how the system evolves under the current assumptions",
    ),
    "computation_predictor": (
        "forecast the {metric} for the next {horizon}",
        "estimate upcoming values from the history",
        "project how the figures will develop over the next {horizon}",
    ),
    "integration_connector": (
        "open a session with the partner system that holds the {dataset}",
        "establish a link to the external {dataset} service",
        "attach to the enterprise system of record",
    ),
    "integration_authenticator": (
        "sign in to the service and obtain an access token",
        "get credentials approved before any data moves",
        "log in with the service account to receive a token",
    ),
    "integration_mapper": (
        "line up the fields with the target system's names",
        "translate each source column into its counterpart in the destination schema",
        "match the incoming attributes to the partner's field names",
    ),
    "integration_queue": (
        "put the work items on the message bus for later processing",
        "enqueue one job per batch for asynchronous handling",
        "hand the batches to the background workers through a queue",
    ),
    "integration_scheduler": (
        "arrange for the job to repeat every {period}",
        "book the run for the next maintenance window",
        "set up a recurring execution every {period}",
    ),
    "utility_logger": (
        "record an audit trail of every stage",
        "write a journal entry for each step for later review",
        "keep a log of what happened for the auditors",
    ),
    "utility_cache": (
        "keep intermediate results in memory so they can be reused",
        "store the partial output for quick reuse",
        "remember computed values to avoid repeating work",
    ),
    "utility_notifier": (
        "alert the {team} team once the results are ready",
        "tell the {team} team by e-mail that the job is done",
        "let the {team} team know the outcome",
    ),
    "utility_tracker": (
        "follow the progress of the job and report its state",
        "keep count of how far the run has got",
        "watch the status of each stage as it completes",
    ),
    "utility_helper": (
        "tidy up the temporary values with a small general-purpose routine",
        "apply the standard housekeeping routine to the data",
        "run the generic clean-up routine on the intermediate values",
    ),
}

OPENINGS: dict[str, tuple[str, ...]] = {
    "basic_file_processing": (
        "A small job on the {dataset}.",
        "We need a quick pass over the {dataset}.",
        "Handle the {dataset} for the {team} team.",
        "Prepare the {dataset} for review.",
        "Process a batch of {dataset}.",
    ),
    "simple_data_transformation": (
        "A single short job.",
        "One small change is needed.",
        "A simple request from the {team} team.",
        "A minor housekeeping task.",
    ),
    "complex_validation_pipeline": (
        "Build a quality-checked pipeline for the {dataset}.",
        "The {team} team needs clean, verified {dataset}.",
        "Run a multi-stage quality check on the {dataset}.",
        "Make the {dataset} trustworthy before they are published.",
        "Put the {dataset} through a validation pipeline.",
    ),
    "complex_network_integration": (
        "Integrate the {dataset} with a remote service.",
        "Exchange the {dataset} with a partner system over its API.",
        "Synchronise the {dataset} between two services.",
        "The {team} team wants the {dataset} moved between web services.",
        "Connect the {dataset} feed to the downstream API.",
    ),
    "advanced_computation_pipeline": (
        "Run an analytical pipeline over the {dataset}.",
        "Produce decision-ready numbers from the {dataset}.",
        "The {team} team needs a full computation over the {dataset}.",
        "Turn the {dataset} into figures the board can act on.",
        "Carry out a complete quantitative study of the {dataset}.",
    ),
}

SOURCE_SENTENCES: tuple[str, ...] = (
    "The input is {source}.",
    "The data comes from {source}.",
    "Everything starts from {source}.",
)

CLOSINGS: tuple[str, ...] = (
    "",
    "Keep the steps in this order.",
    "The order of the steps matters.",
    "Stop when every step has succeeded.",
    "Report when the work is finished.",
)

# Step lists: sentences with connectives, one sentence with semicolons, or numbered lines.
SENTENCE_CONNECTORS: tuple[str, ...] = ("Then", "Next,", "After that,", "Once that is done,")
FIRST_WORDS: tuple[str, ...] = ("First,", "To begin,", "Start by making sure to", "Begin:")
LAST_WORDS: tuple[str, ...] = ("Finally,", "Last,", "To finish,")

DATASETS: tuple[str, ...] = (
    "sales records", "inventory levels", "sensor readings", "user events", "payment transactions",
    "server logs", "customer orders", "shipment updates", "support tickets", "energy meter data",
    "clinical trial results", "web traffic statistics", "payroll entries", "product reviews",
    "weather observations", "stock quotes", "fleet telemetry", "survey responses", "ad impressions",
    "library loans",
)
FORMATS: tuple[str, ...] = ("csv", "json", "xml", "yaml", "parquet")
SCHEMAS: tuple[str, ...] = ("v2 order", "customer", "event", "ledger", "reading", "ticket")
GROUPS: tuple[str, ...] = ("region", "day", "customer", "product line", "hour", "store")
CONDITIONS: tuple[str, ...] = (
    "records from the last 30 days", "rows with a non-zero amount", "entries flagged as active",
    "items priced above 100", "events from mobile clients", "rows without missing values",
)
METRICS: tuple[str, ...] = (
    "average order value", "monthly growth rate", "total revenue", "mean response time", "failure rate",
    "peak load", "net margin", "churn rate",
)
TEAMS: tuple[str, ...] = ("finance", "operations", "data", "marketing", "support", "logistics")
HORIZONS: tuple[str, ...] = ("7 days", "quarter", "12 months", "4 weeks")
PERIODS: tuple[str, ...] = ("hour", "night", "Monday", "15 minutes")
PRECISIONS: tuple[str, ...] = ("2", "3", "4")
