"""The SDK against the daemon's OpenAPI document, both the committed
docs/openapi.json and the one the live daemon serves: every route is
called by some method, every response field has a model field, every
request field has a parameter. A field added to the API fails here until
the SDK has it."""

import dataclasses
import inspect
import json
import os
import typing

import pytest

import hatchery
from hatchery import models
from hatchery.aio import AsyncProcess, AsyncSandbox
from hatchery.client import Network, Policies, Process, Sandbox, Secrets, Snapshot, Template, Tenants

import conftest

DOC = os.path.join(conftest.ROOT, "docs", "openapi.json")

# Response schemas -> the model that holds them.
MODELS = {"Sandbox": models.SandboxInfo, "ExecResponse": models.ExecResult, "FileEntry": models.FileEntry,
          "Snapshot": models.SnapshotInfo, "TemplateInfo": models.TemplateInfo, "BuildAccepted": models.BuildAccepted,
          "NetworkPolicy": models.NetworkPolicy, "NetworkRule": models.NetworkRule,
          "EgressEventBody": models.NetworkEvent, "CodeContext": models.CodeContext,
          "CodeResultItem": models.Result, "CodeError": models.ExecutionError, "ProcessInfo": models.ProcessInfo,
          "PreviewUrl": models.PreviewUrl, "TerminalToken": models.TerminalToken,
          "StoredPolicy": models.StoredPolicy, "PolicySummary": models.PolicySummary,
          "Tenant": models.Tenant, "TenantKey": models.TenantKey,
          "SecretInfo": models.Secret, "SnapshotPool": models.SnapshotPool}
# Schemas a model holds partly under other names:
# schema -> (model, {schema field: model field}, model fields filled from elsewhere).
# A code run's stdout/stderr are Execution.logs; the stream's `done` event
# (CodeSummary) is an Execution less what the other events carried.
RENAMED = {"CodeResponse": (models.Execution, {"stdout": "logs", "stderr": "logs"}, set()),
           "CodeSummary": (models.Execution, {}, {"results", "logs"}),
           # A process output event: its name is the chunk's stream.
           "ProcessChunk": (models.ProcessChunk, {}, {"stream"}),
           # A key just made: the listed key's fields and the key itself.
           "CreatedKey": (models.CreatedKey, {}, set())}
# Wrappers the SDK unwraps: schema -> (field it reads, item schema).
LISTS = {"SandboxList": ("sandboxes", "Sandbox"), "SnapshotList": ("snapshots", "Snapshot"),
         "TemplateList": ("templates", "TemplateInfo"), "FileList": ("entries", "FileEntry"),
         "EgressEventList": ("events", "EgressEventBody"), "CodeContextList": ("contexts", "CodeContext"),
         "ProcessList": ("processes", "ProcessInfo"), "PolicyList": ("policies", "PolicySummary"),
         "TenantList": ("tenants", "Tenant"), "KeyList": ("keys", "TenantKey"),
         "SecretList": ("secrets", "SecretInfo")}
# Fields of a wrapper besides its list, and the SDK method that reads each.
LIST_EXTRAS = {"EgressEventList": {"denied_total": Network.denied_total}}
# Request schemas -> the methods whose parameters carry them.
REQUESTS = {"CreateSandbox": [Sandbox.create], "ExecBody": [Sandbox.exec, Sandbox.exec_stream],
            "PatchSandbox": [Sandbox.set_ttl], "CreateSnapshot": [Sandbox.snapshot],
            "ForkBody": [Snapshot.fork_many], "CreateTemplate": [Template.build, Template.start_build],
            "CodeBody": [Sandbox.run_code, AsyncSandbox.run_code],
            "CreateContext": [Sandbox.create_code_context, AsyncSandbox.create_code_context],
            "SignalBody": [Process.signal, AsyncProcess.signal],
            "CreatePreviewUrl": [Sandbox.preview_url, AsyncSandbox.preview_url],
            "PolicyDocument": [Policies.create, Policies.add_version],
            "NewTenant": [Tenants.create], "TenantPatch": [Tenants.update],
            "CreateSecret": [Secrets.create], "SnapshotPoolBody": [Snapshot.set_pool]}
# Request fields whose parameter has another name (E2B's, for run_code).
PARAMS = {"CodeBody": {"code": "code", "context_id": "context", "env": "envs", "timeout_seconds": "timeout"}}
# Request fields a method leaves out on purpose: a stream cannot run in the
# background (the daemon answers 400).
NOT_PARAMS = {("ExecBody", "Sandbox.exec_stream"): {"background"}}
# Query parameters of a route -> the methods whose parameters carry them
# ({query name: parameter name} where they differ).
QUERIES = {("GET", "/v1/sandboxes/{id}/processes/{pid}/output"): ([Process.output, AsyncProcess.output], {}),
           ("POST", "/v1/sandboxes/{id}/processes/{pid}/wait"): ([Process.wait, AsyncProcess.wait],
                                                                 {"timeout_seconds": "timeout"}),
           ("GET", "/v1/sandboxes/{id}/pty"): ([Sandbox.pty, AsyncSandbox.pty], {})}
# Schemas read as raw JSON (error bodies and stream payloads), or checked
# separately below (enums).
# The terminal's control messages are JSON over the pty WebSocket (oneOf).
RAW = {"ErrorBody", "ErrorDetail", "OutputChunk", "EgressMode", "ExecReason", "OutputEncoding", "CpuLimitBasis",
       "TerminalClientMessage", "TerminalServerMessage",
       # A policy document's parts travel as plain dicts in the document format.
       "Rule", "Match", "ArgCondition", "NumberCondition", "Effect", "Op",
       "CredentialBinding", "Injection", "Scheme",
       # A tenant's limits travel as a plain dict.
       "Limits",
       # A template's state is a string, its build in progress a plain dict.
       "TemplateState", "BuildProgress"}
# Served but left out of the document on purpose (docs/api.md).
UNDOCUMENTED = {("GET", "/openapi.json")}


def model_fields(cls):
    return {f.name for f in dataclasses.fields(cls)} - {"extra"}


def optional_fields(cls):
    return {f.name for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def resolved(schemas, s):
    """(properties, required) of a schema, `allOf` parts merged."""
    if "$ref" in s:
        s = schemas[s["$ref"].split("/")[-1]]
    props, required = dict(s.get("properties", {})), set(s.get("required", []))
    for part in s.get("allOf", []):
        p, r = resolved(schemas, part)
        props.update(p)
        required |= r
    return props, required


def check(doc):
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    sdk = set(hatchery.ROUTES)
    assert ops - sdk == set(), "routes the SDK does not call"
    assert sdk - ops - UNDOCUMENTED == set(), "SDK routes the API does not have"

    schemas = doc["components"]["schemas"]
    unknown = set(schemas) - set(MODELS) - set(RENAMED) - set(LISTS) - set(REQUESTS) - RAW
    assert not unknown, f"schemas this test does not map to the SDK: {unknown}"
    for name, cls in MODELS.items():
        assert set(schemas[name]["properties"]) == model_fields(cls), name
        required = set(schemas[name].get("required", []))
        assert required & optional_fields(cls) <= {"metadata"}, (name, required & optional_fields(cls))
    for name, (cls, renames, elsewhere) in RENAMED.items():
        props, required = resolved(schemas, schemas[name])
        assert {renames.get(p, p) for p in props} | elsewhere == model_fields(cls), name
        required = {renames.get(p, p) for p in required}
        assert not required & optional_fields(cls), (name, required & optional_fields(cls))
    for name, (field, item) in LISTS.items():
        props = schemas[name]["properties"]
        extras = set(LIST_EXTRAS.get(name, {}))
        assert set(props) - {"path"} - extras == {field} and props[field]["items"]["$ref"].endswith("/" + item), name
        assert extras <= set(props), (name, extras)
    for name, fns in REQUESTS.items():
        for fn in fns:
            params = set(inspect.signature(fn).parameters)
            names = PARAMS.get(name, {})
            missing = {names.get(p, p) for p in schemas[name]["properties"]} - params
            missing -= NOT_PARAMS.get((name, fn.__qualname__), set())
            assert not missing, f"{fn.__qualname__} lacks {missing} of {name}"
    for (method, route), (fns, names) in QUERIES.items():
        query = {p["name"] for p in doc["paths"][route][method.lower()].get("parameters", []) if p["in"] == "query"}
        for fn in fns:
            missing = {names.get(q, q) for q in query} - set(inspect.signature(fn).parameters)
            assert not missing, f"{fn.__qualname__} lacks the query parameters {missing} of {route}"
    assert set(schemas["OutputChunk"]["properties"]) == {"data"}
    assert set(schemas["ErrorDetail"]["properties"]) == {"code", "message"}
    assert list(typing.get_args(models.ExecReason)) == schemas["ExecReason"]["enum"]
    assert list(typing.get_args(models.OutputEncoding)) == schemas["OutputEncoding"]["enum"]
    assert list(typing.get_args(models.CpuLimitBasis)) == schemas["CpuLimitBasis"]["enum"]


def test_committed_document():
    with open(DOC) as f:
        check(json.load(f))


def test_live_document(client):
    check(client.openapi())


def test_check_catches_a_new_field():
    with open(DOC) as f:
        doc = json.load(f)
    doc["components"]["schemas"]["ExecResponse"]["properties"]["new_field"] = {"type": "integer"}
    with pytest.raises(AssertionError):
        check(doc)
    with open(DOC) as f:
        doc = json.load(f)
    doc["components"]["schemas"]["ExecBody"]["properties"]["priority"] = {"type": "integer"}
    with pytest.raises(AssertionError):
        check(doc)
    for schema in ("CodeSummary", "CodeBody", "CodeResultItem", "ProcessInfo", "ProcessChunk", "SignalBody"):
        with open(DOC) as f:
            doc = json.load(f)
        doc["components"]["schemas"][schema]["properties"]["new_field"] = {"type": "integer"}
        with pytest.raises(AssertionError):
            check(doc)
    with open(DOC) as f:
        doc = json.load(f)
    doc["components"]["schemas"]["ExecReason"]["enum"].append("paused")
    with pytest.raises(AssertionError):
        check(doc)
    with open(DOC) as f:
        doc = json.load(f)
    doc["paths"]["/v1/sandboxes/{id}/pause"] = {"post": {}}
    with pytest.raises(AssertionError):
        check(doc)
    with open(DOC) as f:
        doc = json.load(f)
    doc["paths"]["/v1/sandboxes/{id}/processes/{pid}/output"]["get"]["parameters"].append(
        {"name": "tail", "in": "query", "schema": {"type": "integer"}})
    with pytest.raises(AssertionError):
        check(doc)
    with open(DOC) as f:
        doc = json.load(f)
    doc["components"]["schemas"]["OutputEncoding"]["enum"].append("hex")
    with pytest.raises(AssertionError):
        check(doc)
