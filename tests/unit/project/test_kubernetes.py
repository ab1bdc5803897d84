"""deploy/kubernetes/: valid against the Kubernetes schemas (offline), probes on the right paths, grace periods."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from project import settings as project_settings
from scheduling.due_at import control
from tests.support import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest version still in common support the manifests must pass
GRACE_MARGIN_SECONDS = 10  # Celery's own exit after the soft shutdown and the control loop's stop


def resources() -> list[dict[str, Any]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        found.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return found


def by_name(kind: str, name: str) -> dict[str, Any]:
    for resource in resources():
        if resource["kind"] == kind and resource["metadata"]["name"] == name:
            return resource
    raise AssertionError(f"no {kind} {name} in deploy/kubernetes")


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def config() -> dict[str, str]:
    return by_name("ConfigMap", "timekeeper")["data"]


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, kubernetes_validate.latest_version()])
def test_every_manifest_is_valid_against_the_schemas_strictly(version):
    """Each resource passes kubernetes-validate in strict mode (no unknown fields) for old and new versions."""
    checked = 0
    for resource in resources():
        kubernetes_validate.validate(resource, version, strict=True)
        checked += 1
    assert checked >= 10


def test_web_is_ready_on_readyz_and_alive_on_livez():
    """The web pod's readiness probe is /readyz and its liveness (and startup) probe /livez, never /healthz."""
    web = container(by_name("Deployment", "timekeeper-web"))
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert web["startupProbe"]["httpGet"]["path"] == "/livez"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        headers = {h["name"]: h["value"] for h in web[probe]["httpGet"]["httpHeaders"]}
        assert headers["Host"] in config()["ALLOWED_HOSTS"].split(","), "the probe's Host is an allowed host"


@pytest.mark.parametrize(("name", "role"), [("timekeeper-worker", "worker"), ("timekeeper-worker-deferred", "worker"),
                                            ("timekeeper-worker-exports", "worker"),
                                            ("timekeeper-beat", "beat")])  # fmt: skip
def test_workers_and_beat_are_alive_by_timekeeper_probe(name, role):
    """Workers and beat run `manage.py timekeeper probe <role>` as liveness, with the liveness dir mounted."""
    deployment = by_name("Deployment", name)
    main = container(deployment)
    assert main["livenessProbe"]["exec"]["command"] == ["python", "manage.py", "timekeeper", "probe", role]
    mounts = {m["mountPath"] for m in main["volumeMounts"]}
    assert config()["SCHEDULING_LIVENESS_DIR"] in mounts


@pytest.mark.parametrize("name", ["timekeeper-worker", "timekeeper-worker-deferred", "timekeeper-worker-exports"])
def test_worker_grace_period_covers_the_soft_shutdown_and_the_control_loop_stop(name):
    """terminationGracePeriodSeconds > soft shutdown + the control loop's stop + a margin; SIGTERM is remapped."""
    deployment = by_name("Deployment", name)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    soft = float(config()["CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS"])
    assert grace >= soft + control.STOP_JOIN_SECONDS + GRACE_MARGIN_SECONDS
    assert config()["REMAP_SIGTERM"] == "SIGQUIT"
    assert project_settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1, "prefetch as documented in worker.yaml"


def test_queues_are_split_between_job_and_deferral_workers():
    """Job workers exclude timekeeper.deferred; deferral workers consume only it."""
    jobs = container(by_name("Deployment", "timekeeper-worker"))["args"]
    deferred = container(by_name("Deployment", "timekeeper-worker-deferred"))["args"]
    assert jobs[jobs.index("-X") + 1] == "timekeeper.deferred"
    assert deferred[deferred.index("-Q") + 1] == "timekeeper.deferred"


def test_a_second_pool_serves_the_named_queue_of_its_kinds():
    """worker-exports consumes only "exports", the queue demo.export belongs to; the job workers do not consume it."""
    from scheduling.core import registry

    exports = container(by_name("Deployment", "timekeeper-worker-exports"))["args"]
    assert exports[exports.index("-Q") + 1] == "exports" == registry.get("demo.export").queue
    jobs = container(by_name("Deployment", "timekeeper-worker"))["args"]
    assert "-Q" not in jobs, "the job workers serve Celery's declared queues only"
    assert "exports" not in jobs
    assert "exports" not in {q.name for q in project_settings.CELERY_TASK_QUEUES}


def test_beat_runs_two_replicas_and_every_deployment_has_a_disruption_budget():
    """Beat has 2 replicas (one leads); each Deployment is covered by a PodDisruptionBudget; no CronJob."""
    assert by_name("Deployment", "timekeeper-beat")["spec"]["replicas"] == 2
    budgets = [r["spec"]["selector"]["matchLabels"] for r in resources() if r["kind"] == "PodDisruptionBudget"]
    for deployment in (r for r in resources() if r["kind"] == "Deployment"):
        assert deployment["spec"]["selector"]["matchLabels"] in budgets, deployment["metadata"]["name"]
    assert not [r for r in resources() if r["kind"] == "CronJob"], "fixed-time work belongs to beat"


def test_the_migration_job_migrates_directly_then_syncs_schedules():
    """The Job runs migrate on the direct URL (DDL locks need a session) and then `timekeeper sync`."""
    job = by_name("Job", "timekeeper-migrate")
    command = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert 'DATABASE_URL="$SCHEDULING_DIRECT_DATABASE_URL" python manage.py migrate' in command
    assert command.index("migrate") < command.index("manage.py timekeeper sync")


def test_the_secret_separates_the_pooled_and_the_direct_database():
    """DATABASE_URL goes to the pooler and SCHEDULING_DIRECT_DATABASE_URL to PostgreSQL, different hosts."""
    data = by_name("Secret", "timekeeper")["stringData"]
    assert data["DATABASE_URL"] != data["SCHEDULING_DIRECT_DATABASE_URL"]
    assert config()["DATABASE_DISABLE_SERVER_SIDE_CURSORS"] == "1"
