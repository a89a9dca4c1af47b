"""Validates `roar export` output with third-party implementations of each standard.

    python3 validate_export.py prov-json FILE      # PROV-JSON schema + the `prov` library's parser
    python3 validate_export.py openlineage FILE    # OpenLineage's own client model, event by event

Prints one line per problem and exits 1 if there is any.
"""

import json
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).parent


def check_prov(text):
    import jsonschema
    from prov.model import ProvDocument

    # The parser warns where it drops something it cannot resolve: that is a failure here.
    warnings.simplefilter("error")
    doc = json.loads(text)
    schema = json.loads((HERE / "schemas" / "prov-json.schema.json").read_text())
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"schema: {e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
    # The reference implementation must read it back with every record and relation.
    try:
        parsed = ProvDocument.deserialize(content=text, format="json")
    except Exception as e:  # noqa: BLE001 - every failure is a finding
        return errors + [f"prov parser rejects it: {type(e).__name__}: {e}"]
    records = parsed.get_records()
    kinds = {}
    for r in records:
        kinds[r.get_type().localpart] = kinds.get(r.get_type().localpart, 0) + 1
    expected = {
        "Entity": len(doc.get("entity", {})),
        "Activity": len(doc.get("activity", {})),
        "Usage": len(doc.get("used", {})),
        "Generation": len(doc.get("wasGeneratedBy", {})),
        "Derivation": len(doc.get("wasDerivedFrom", {})),
        "Communication": len(doc.get("wasInformedBy", {})),
    }
    for kind, n in expected.items():
        if kinds.get(kind, 0) != n:
            errors.append(f"prov parser: {kinds.get(kind, 0)} {kind} records, the JSON has {n}")
    return errors


def first_difference(a, b, where="$"):
    """The first place two JSON values differ, as [(path, a, b)], or []."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            found = first_difference(a.get(k), b.get(k), f"{where}.{k}")
            if found:
                return found
        return []
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return []
    return [] if a == b else [(where, a, b)]


def check_openlineage(text):
    import attr
    from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
    from openlineage.client.generated.base import DatasetFacet, RunFacet
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.job_type_job import JobTypeJobFacet
    from openlineage.client.generated import parent_run
    from openlineage.client.generated.processing_engine_run import ProcessingEngineRunFacet
    from openlineage.client.generated.source_code_location_job import SourceCodeLocationJobFacet
    from openlineage.client.serde import Serde

    # roar's own facets, declared the way the client documents custom facets.
    @attr.define
    class ContentDatasetFacet(DatasetFacet):
        blake3: str
        size: int
        sha256: str | None = attr.field(default=None)

        @staticmethod
        def _get_schema():
            return "urn:roar:facet:ContentDatasetFacet"

    @attr.define
    class JobRunFacet(RunFacet):
        jobId: int
        argv: list
        cwd: str
        status: str
        exitCode: int | None = attr.field(default=None)
        gitCommit: str | None = attr.field(default=None)
        gitDirty: bool | None = attr.field(default=None)
        gitDiff: str | None = attr.field(default=None)
        step: int | None = attr.field(default=None)
        parentStep: int | None = attr.field(default=None)

        @staticmethod
        def _get_schema():
            return "urn:roar:facet:JobRunFacet"

    @attr.define
    class ParametersRunFacet(RunFacet):
        parameters: dict

        @staticmethod
        def _get_schema():
            return "urn:roar:facet:ParametersRunFacet"

    @attr.define
    class EnvironmentRunFacet(RunFacet):
        packages: list
        runtime: dict | None = attr.field(default=None)

        @staticmethod
        def _get_schema():
            return "urn:roar:facet:EnvironmentRunFacet"

    def plain(d):
        return {k: v for k, v in d.items() if not k.startswith("_")}

    def dataset_facets(facets):
        out = {}
        for name, f in facets.items():
            cls = {"version": DatasetVersionDatasetFacet, "roar_content": ContentDatasetFacet}[name]
            out[name] = cls(**plain(f), producer=f["_producer"])
        return out

    errors = []
    runs = {}
    for n, line in enumerate(text.splitlines(), 1):
        try:
            ev = json.loads(line)
            run_facets = {
                "processing_engine": ProcessingEngineRunFacet(
                    **plain(ev["run"]["facets"]["processing_engine"]),
                    producer=ev["producer"],
                ),
                "roar": JobRunFacet(**plain(ev["run"]["facets"]["roar"]), producer=ev["producer"]),
            }
            optional = {"parameters": ParametersRunFacet, "environment": EnvironmentRunFacet}
            for name, cls in optional.items():
                if name in ev["run"]["facets"]:
                    run_facets[name] = cls(**plain(ev["run"]["facets"][name]), producer=ev["producer"])
            if "parent" in ev["run"]["facets"]:
                # A step's run is a child of its job's run: the standard facet.
                parent = ev["run"]["facets"]["parent"]
                run_facets["parent"] = parent_run.ParentRunFacet(
                    run=parent_run.Run(runId=parent["run"]["runId"]),
                    job=parent_run.Job(**parent["job"]),
                    producer=ev["producer"],
                )
            job_facets = {
                "jobType": JobTypeJobFacet(
                    **plain(ev["job"]["facets"]["jobType"]), producer=ev["producer"]
                )
            }
            if "sourceCodeLocation" in ev["job"]["facets"]:
                job_facets["sourceCodeLocation"] = SourceCodeLocationJobFacet(
                    **plain(ev["job"]["facets"]["sourceCodeLocation"]), producer=ev["producer"]
                )
            event = RunEvent(
                eventType=RunState(ev["eventType"]),
                eventTime=ev["eventTime"],
                producer=ev["producer"],
                run=Run(runId=ev["run"]["runId"], facets=run_facets),
                job=Job(namespace=ev["job"]["namespace"], name=ev["job"]["name"], facets=job_facets),
                inputs=[
                    InputDataset(d["namespace"], d["name"], facets=dataset_facets(d["facets"]))
                    for d in ev["inputs"]
                ],
                outputs=[
                    OutputDataset(d["namespace"], d["name"], facets=dataset_facets(d["facets"]))
                    for d in ev["outputs"]
                ],
            )
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            errors.append(f"event {n}: the OpenLineage client rejects it: {type(e).__name__}: {e}")
            continue
        theirs = Serde.to_dict(event)
        # Optional per-direction facet maps the client always writes, empty.
        for d in theirs.get("inputs", []):
            if d.get("inputFacets") == {}:
                del d["inputFacets"]
        for d in theirs.get("outputs", []):
            if d.get("outputFacets") == {}:
                del d["outputFacets"]
        for where, ours, client in first_difference(ev, theirs):
            errors.append(f"event {n}: {where}: roar wrote {ours!r}, the client model gives {client!r}")
        runs.setdefault(ev["run"]["runId"], []).append(ev["eventType"])
    # The spec: one START and one terminal event per run.
    for run_id, types in runs.items():
        if types[0] != "START" or len(types) != 2 or types[1] not in ("COMPLETE", "FAIL", "ABORT"):
            errors.append(f"run {run_id}: events {types}, want START then COMPLETE/FAIL/ABORT")
    return errors


def main():
    kind, path = sys.argv[1], sys.argv[2]
    text = Path(path).read_text()
    errors = {"prov-json": check_prov, "openlineage": check_openlineage}[kind](text)
    for e in errors:
        print(e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
