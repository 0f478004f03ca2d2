"""The timekeeper's HTTP layer: budgets, meter reports, pods, health and metrics (described in openapi.yaml)."""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import yaml
from flask import Flask, Response, g, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from gpusharing.contract import TIMEKEEPER_TOKEN_HEADER, BudgetState
from gpusharing.env import ConfigError
from gpusharing.env import load_code
from gpusharing.jsonbody import JsonBodyError, read_json
from gpusharing.kube import in_cluster_available
from gpusharing.metrics import render_metrics
from gpusharing.names import InvalidName, check_budget_name, check_namespace
from gpusharing.report import MeterReport, ReportError
from gpusharing.serving import ON_STOP
from gpusharing.weights import weight_number
from timekeeper import metrics
from timekeeper.accounting import ReportLedger, ReportQueue
from timekeeper.auth import Authenticator, Caller, Forbidden, StaticTokens, Unauthenticated, load_static_tokens
from timekeeper.budget import (
    BudgetRequestError,
    BudgetStatus,
    budget_changes_from_json,
    budget_from_json,
    default_budget_json,
    top_up_from_json,
)
from timekeeper.commitments import PodCommitments, listing_json, watched_pods
from timekeeper.config import DEFAULT_CLOCK, TimekeeperConfig
from timekeeper.db import Database
from timekeeper.controller import Controller
from timekeeper.kube import KubeApi, KubeUnavailable
from timekeeper.schema import head_revision, schema_problem
from timekeeper.store import BudgetChange, BudgetStore, Clock, HierarchyConflict, Managed, NoBudget, NoLimit, utc_now
from timekeeper.usage import UsageRequestError, usage_csv, usage_request

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
MAX_PODS = 10_000
NO_AUTH_WARNING = (
    "TIMEKEEPER_AUTH=none: ANYONE who can reach this timekeeper can change budgets and report usage. "
    "Use it for a local demo only."
)


def create_app(
    config: TimekeeperConfig | None = None,
    kube: KubeApi | None = None,
    clock: Clock | None = None,
    background: bool = True,
    commitments: PodCommitments | None = None,
) -> Flask:
    """The app; `kube` defaults to TIMEKEEPER_KUBECONFIG, KUBECONFIG or the in-cluster API, `clock` to
    TIMEKEEPER_CLOCK, `background` runs the controller's loop and follows the cluster's GPU pods (`commitments`,
    for safe admission)."""
    config = config or TimekeeperConfig.from_env()
    if clock is None:
        clock = load_code("TIMEKEEPER_CLOCK", config.clock)
        if config.clock != DEFAULT_CLOCK:
            log.warning("TIMEKEEPER_CLOCK=%s: the time comes from a test clock, never use it in a cluster", config.clock)
    if kube is None:
        kube = kube_api(config)
    if config.auth == "none":
        log.warning(NO_AUTH_WARNING)
    if kube is None:
        log.warning("no Kubernetes API configured: namespaces over budget get no Event and no pod is evicted")
    tokens = load_static_tokens(config.static_tokens_file) if config.static_tokens_file else StaticTokens({})
    auth = Authenticator(config.auth, tokens, kube, config.auth_cache_seconds)
    db = Database.from_config(config)
    budgets = BudgetStore(db, config.default_gpu_minutes, config.default_period, clock)
    ledger = ReportLedger(budgets, catalogue=config.catalogue, catalogue_source=config.catalogue_source)
    reports = ReportQueue(ledger)
    controller = (
        Controller(budgets, kube, config.priority_class_in_budget, config.demotion_interval_seconds, config.lease_namespace)
        if kube else None
    )
    if controller is not None and background:
        controller.start()
    if commitments is None and kube is not None and background:
        commitments = watched_pods(kube, config.catalogue, clock, metrics.record_pod_sync)
    head = head_revision()
    collector = metrics.LedgerCollector(ledger, commitments)

    app = Flask("timekeeper")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions.update(timekeeper_config=config, budgets=budgets, ledger=ledger, reports=reports, controller=controller, database=db)
    # On SIGTERM, once the requests in flight are answered: the controller's pass under way finishes (its evictions and
    # Events recorded as done) and it gives up its Lease, then the report queue, already empty, closes.
    app.extensions[ON_STOP] = [*([controller.stop] if controller is not None else []), reports.close,
                               *([commitments.stop] if commitments is not None else [])]

    def committed() -> dict[str, Any] | None:
        return None if commitments is None else commitments.by_namespace()

    def listed(statuses: list[BudgetStatus]) -> list[dict[str, Any]]:
        """Statuses with their commitments (a group's count the pods of all the namespaces below it)."""
        now_committed = committed()
        return listing_json(statuses, now_committed, budgets.budgets() if now_committed else {})

    def status_json(status: BudgetStatus) -> Response:
        return jsonify(listed([status])[0])

    def caller() -> Caller:
        return auth.caller(request.headers.get("Authorization") or request.headers.get(TIMEKEEPER_TOKEN_HEADER))

    def admin() -> Caller:
        who = caller()
        auth.check_admin(who)
        return who

    def body() -> Any:
        if not request.is_json:
            raise JsonBodyError("the body is not JSON (Content-Type: application/json)")
        return read_json(request.get_data(cache=False))

    def crossing(crossed: bool, status: BudgetStatus, cause: str) -> None:
        """Wakes the controller when a change moved a state or passed a warning threshold."""
        if not crossed:
            return
        if status.state is BudgetState.OVER_BUDGET:
            log.info("namespace %s went over its GPU budget: %s", status.namespace, cause,
                     extra={"namespace": status.namespace, "state": str(status.state)})
        if controller is not None:
            controller.wake()

    def changed(action: str, who: Caller, status: BudgetStatus) -> None:
        log.info("namespace %s: budget %s by %s; %s GPU-minutes %s, %s", status.namespace, action, who.name,
                 "unlimited" if status.gpu_minutes is None else f"{status.gpu_minutes:g}", status.period, status.state,
                 extra={"namespace": status.namespace, "actor": who.name, "action": action, "state": str(status.state)})

    @app.before_request
    def _start_clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def _observe(response: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule else "unmatched"
        metrics.LATENCY.labels(rule).observe(time.perf_counter() - g.get("started", time.perf_counter()))
        return response

    @app.get("/api/v1/budgets")
    def list_budgets() -> Response:
        caller()
        default = default_budget_json(budgets.default_gpu_minutes, budgets.default_period)
        return jsonify(items=listed(budgets.statuses()), default=default)

    @app.get("/api/v1/budgets/<name>")
    def get_budget(name: str) -> Response:
        caller()
        return status_json(budgets.status(check_budget_name(name)))

    def answer_change(change: BudgetChange, who: Caller) -> tuple[Response, int]:
        changed("set", who, change.status)
        crossing(change.crossed, change.status, f"its budget was set by {who.name}")
        return status_json(change.status), 201 if change.created else 200

    @app.put("/api/v1/budgets/<name>")
    def put_budget(name: str) -> tuple[Response, int]:
        who = admin()
        return answer_change(budgets.set_budget(budget_from_json(name, body(), config.default_period), who.name), who)

    @app.patch("/api/v1/budgets/<name>")
    def patch_budget(name: str) -> tuple[Response, int]:
        who = admin()
        return answer_change(budgets.patch_budget(check_budget_name(name), budget_changes_from_json(body()), who.name), who)

    @app.delete("/api/v1/budgets/<name>")
    def delete_budget(name: str) -> Response | tuple[str, int]:
        who = admin()
        status = budgets.remove_budget(check_budget_name(name), who.name)
        log.info("%s: budget removed by %s", name, who.name, extra={"namespace": name, "actor": who.name, "action": "removal"})
        if status is None:  # a group: nothing applies in its place
            return "", 204
        crossing(True, status, f"its budget was removed by {who.name}")
        return status_json(status)

    @app.post("/api/v1/budgets/<name>/top-ups")
    def post_top_up(name: str) -> tuple[Response, int]:
        who = admin()
        gpu_minutes, reason = top_up_from_json(body())
        status = budgets.top_up(check_budget_name(name), gpu_minutes, reason, who.name)
        changed(f"top-up of {gpu_minutes:g} GPU-minutes ({reason!r})", who, status)
        crossing(True, status, f"a top-up by {who.name}")
        return status_json(status), 201

    @app.get("/api/v1/budgets/<name>/changes")
    def get_changes(name: str) -> Response:
        caller()
        return jsonify(items=budgets.changes(check_budget_name(name)))

    @app.post("/api/v1/reports")
    def post_report() -> Response:
        outcome = "rejected"
        report: MeterReport | None = None
        try:
            who = caller()
            report = MeterReport.from_json(body())
            result = reports.submit(report, auth.report_terms(who, report))
            outcome = result.outcome.value
        except (Unauthenticated, Forbidden, ReportError) as refused:
            outcome = {Unauthenticated: "unauthenticated", Forbidden: "forbidden"}.get(type(refused), "rejected")
            # The pod and namespace only once the report parsed: before, they are whatever a client sent.
            fields = {"decision": outcome} | ({"namespace": report.namespace, "pod": report.pod} if report else {})
            log.warning("report refused (%s): %s", outcome, refused, extra=fields)
            raise
        finally:
            metrics.REPORTS.labels(outcome).inc()
        log.debug("report %d of pod %s/%s: %s", report.seq, report.namespace, report.pod, outcome,
                  extra={"namespace": report.namespace, "pod": report.pod, "decision": outcome})
        crossing(result.crossed, result.status, f"the report of pod {report.pod}")
        return jsonify(result.to_json())

    @app.get("/api/v1/pods")
    def list_pods() -> Response:
        caller()
        over_memory = _flag(request.args.get("overMemory", "false"), "overMemory")
        namespace = request.args.get("namespace")
        limit = _limit(request.args.get("limit", "500"))
        pods = ledger.pods(check_namespace(namespace) if namespace else None, over_memory, limit)
        return jsonify(items=[pod.to_json() for pod in pods])

    @app.get("/api/v1/usage")
    def get_usage() -> Response:
        caller()
        args = request.args
        namespace = args.get("namespace")
        asked = usage_request(args.get("from"), args.get("to"), args.get("groupBy"), check_namespace(namespace) if namespace else None)
        report = ledger.usage.report(asked)
        if request.accept_mimetypes.best_match(["application/json", "text/csv"]) == "text/csv":
            filename = f"gpu-usage-{asked.start}-{asked.end}.csv"
            return Response(usage_csv(report.fields, (row.to_json() for row in report.rows)), content_type="text/csv; charset=utf-8",
                            headers={"Content-Disposition": f'attachment; filename="{filename}"'})
        return jsonify(report.to_json())

    @app.get("/api/v1/gpu-models")
    def get_gpu_models() -> Response:
        caller()
        catalogue = config.catalogue
        return jsonify(
            items=[{"name": m.name, "memoryMiB": m.memory_mib, "billingWeight": weight_number(m.billing_weight)} for m in catalogue.models],
            default=catalogue.default.name,
            changes=[change.to_json() for change in ledger.weights.history()],
        )

    @app.get("/livez")
    def livez() -> Response:
        return jsonify(status="ok")

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        problem = schema_problem(db.engine, head)
        if problem:
            return jsonify(status="unready", reason=problem), 503
        return jsonify(status="ok"), 200

    @app.get("/metrics")
    def prometheus() -> Response:
        if config.metrics_auth == "token":
            caller()
        payload, content_type = render_metrics(collector)
        return Response(payload, content_type=content_type)

    @app.errorhandler(Unauthenticated)
    def unauthenticated(exc: Unauthenticated) -> tuple[Response, int, dict[str, str]]:
        return jsonify(error=str(exc)), 401, {"WWW-Authenticate": 'Bearer realm="gpusharing-timekeeper"'}

    @app.errorhandler(Forbidden)
    def forbidden(exc: Forbidden) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 403

    @app.errorhandler(ReportError)
    @app.errorhandler(UsageRequestError)
    @app.errorhandler(BudgetRequestError)
    @app.errorhandler(InvalidName)
    @app.errorhandler(JsonBodyError)
    def bad_request(exc: ValueError) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 400

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge) -> tuple[Response, int]:
        return jsonify(error=f"the body is larger than the {MAX_BODY_BYTES} bytes the timekeeper reads"), 413

    @app.errorhandler(NoBudget)
    def no_budget(exc: NoBudget) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 404

    @app.errorhandler(NoLimit)
    @app.errorhandler(Managed)
    @app.errorhandler(HierarchyConflict)
    def conflict(exc: Exception) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 409

    @app.errorhandler(KubeUnavailable)
    def kube_unavailable(exc: KubeUnavailable) -> tuple[Response, int]:
        return jsonify(error=f"the Kubernetes API is unavailable, try again: {exc}"), 503

    @app.errorhandler(FutureTimeout)
    def ledger_busy(exc: FutureTimeout) -> tuple[Response, int]:
        return jsonify(error="the ledger is busy, try again (a retried report is never counted twice)"), 503

    @app.errorhandler(SQLAlchemyError)
    def database_unavailable(exc: SQLAlchemyError) -> tuple[Response, int]:
        log.error("database error: %s", exc)
        return jsonify(error="the database is unavailable, try again"), 503

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        return jsonify(error=exc.description), exc.code or 500

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> tuple[Response, int]:  # a bug: logged here, never a traceback in the answer
        log.exception("unexpected error on %s %s", request.method, request.path)
        return jsonify(error="internal error; see the timekeeper's log"), 500

    return app


OFF_CLUSTER = (
    "TIMEKEEPER_AUTH=tokenreview checks tokens with the Kubernetes API, and there is no in-cluster ServiceAccount "
    "here: set KUBECONFIG (or TIMEKEEPER_KUBECONFIG), or off-cluster TIMEKEEPER_AUTH=static with "
    "TIMEKEEPER_STATIC_TOKENS_FILE (TIMEKEEPER_AUTH=none for a local demo)"
)


def kube_api(config: TimekeeperConfig) -> KubeApi | None:
    """The Kubernetes API of the kubeconfig (TIMEKEEPER_KUBECONFIG, else KUBECONFIG) or of the cluster the timekeeper
    runs in; None when neither.

    ConfigError, one line saying what to set, when tokenreview has no API or the kubeconfig cannot be read.
    """
    in_cluster = in_cluster_available()
    if config.auth == "tokenreview" and not config.kubeconfig and not in_cluster:
        raise ConfigError(OFF_CLUSTER)
    if not config.kubeconfig and not in_cluster:
        return None
    try:
        return KubeApi.from_kubeconfig(config.kubeconfig)
    except ConfigError:
        raise
    except (yaml.YAMLError, TypeError, AttributeError, ValueError) as exc:  # the client's reading of a malformed file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"the kubeconfig {config.kubeconfig} (TIMEKEEPER_KUBECONFIG, else KUBECONFIG) is not one: {first}") from None


def _flag(raw: str, name: str) -> bool:
    if raw not in ("true", "false"):
        raise BudgetRequestError(f"{name} must be true or false, not {raw!r}")
    return raw == "true"


def _limit(raw: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", raw) or not 1 <= int(raw) <= MAX_PODS:
        raise BudgetRequestError(f"limit must be a whole number from 1 to {MAX_PODS}, not {raw!r}")
    return int(raw)
