"""kubectl vlm: look at VLMServices and drive their canary rollouts from kubectl.

    kubectl vlm status [NAME] [-n NS | -A] [-o table|json]       services, rollout progress, top function
    kubectl vlm status NAME --watch [--timeout 30m]              wait for the rollout: exit 0 promoted,
                                                                 1 rolled back/aborted/invalid, 2 timeout
    kubectl vlm promote|abort|pause|resume NAME [-n NS] [--wait] drive the running canary
    kubectl vlm retry NAME [-n NS] [--wait]                      analyse a rolled-back/aborted revision again
    kubectl vlm profile POD [-n NS] [-o FILE] [--view svg|json|diff [--against stable|baseline|ID|pod/NAME]]

Installed as the console script `kubectl-vlm` (pip install 'vlm-operator[plugin]', or [operator]), so kubectl
finds it on PATH; kubectl-plugin/kubectl-vlm is a shim for checkouts and the krew archive. Needs only the
`kubernetes` package. It reads the kubeconfig like kubectl (KUBECONFIG or ~/.kube/config; --kubeconfig and
--context override) and talks only to the API server: promote/abort/pause/resume set the annotation
serving.vlmops.dev/rollout-action, which the operator acts on and clears; retry clears status.rollout
(the operator holds a rolled-back revision only while status.rollout names it); profile goes through the
API server's pod proxy, so no port-forward is needed.

The plugin must run with the kubernetes client alone: from vlm_operator it imports only `names` (the
names it shares with the operator, a module without imports), which the krew archive carries next to this
file as vlm_names.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

try:
    from vlm_operator.api import names
except ImportError:  # the krew archive: this file at the top level, vlm_operator/api/names.py beside it
    import vlm_names as names

GROUP, VERSION, PLURAL = names.GROUP, names.VERSION, names.PLURAL
ACTION_ANNOTATION = names.ANNOTATION_ROLLOUT_ACTION
LABEL_SERVICE, LABEL_ROLE = names.LABEL_SERVICE, names.LABEL_ROLE
SIDECAR_PORT = names.SIDECAR_PORT
ACTIVE_PHASES = names.ACTIVE_PHASES
HELD_PHASES = names.HELD_PHASES  # the operator keeps the stable revision until the spec changes
VIEWS = {"svg": "profile/latest.svg", "json": "profile/latest.json", "diff": "profile/diff.svg"}
COLLAPSED = ("profile/latest.json", {"format": "collapsed"})
COLUMNS = ("NAME", "MODEL", "READY", "PHASE", "ROLLOUT", "STEP", "CANARY", "VERDICT", "DECIDED-BY", "LOOP-P95",
           "TOP-FUNCTION", "AGE")
# `status --watch` exit codes, for CI pipelines.
EXIT_PROMOTED, EXIT_NOT_PROMOTED, EXIT_TIMEOUT, EXIT_ERROR = 0, 1, 2, 3


class PluginError(Exception):
    """A failure to report on one line, without a traceback."""


class NotFound(PluginError):
    """The object asked for does not exist (final, unlike a failed request)."""


# ---- pure: rows, table, patches, paths, outcomes ----

def _age(created: str | None, now: datetime) -> str:
    if not created:
        return "<unknown>"
    secs = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def service_row(obj: Mapping[str, Any], now: datetime) -> dict[str, str]:
    """One VLMService as the status table shows it (the spec decides the step count, status the rest)."""
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    ro, prof = st.get("rollout") or {}, st.get("profiler") or {}
    # the status says how many analysed steps the rollout has (the default schedule follows spec.replicas)
    steps = ro.get("steps") or len(((spec.get("rollout") or {}).get("steps")) or [None])
    active = ro.get("phase") in ACTIVE_PHASES
    top = ro.get("regressedFunction") if ro.get("phase") == "RolledBack" else None
    return {
        "NAMESPACE": obj["metadata"].get("namespace", ""),
        "NAME": obj["metadata"]["name"],
        "MODEL": (spec.get("model") or {}).get("path", ""),
        "READY": f"{st.get('readyReplicas', 0) or 0}/{spec.get('replicas', 1)}",
        "PHASE": _phase(st),
        "ROLLOUT": ro.get("phase") or "-",
        "STEP": f"{int(ro.get('step', 0)) + 1}/{steps}" if active else "-",
        "CANARY": (st.get("canaryRevision") or ro.get("revision") or "-") if active else "-",
        "VERDICT": ro.get("verdict") or ro.get("reason") or "-",
        # What decided each step of the rollout (evidence, ceiling, timeout): how often the clock decides.
        "DECIDED-BY": ",".join(str(d.get("decidedBy", "?")) for d in ro.get("decisions") or []) or "-",
        "LOOP-P95": prof.get("loopP95") or "-",
        "TOP-FUNCTION": top or prof.get("topFunction") or "-",
        "AGE": _age(obj["metadata"].get("creationTimestamp"), now),
    }


def _phase(st: Mapping[str, Any]) -> str:
    """status.phase, with the Ready condition's reason when the service failed ("Failed (ImagePullFailed)")."""
    phase = st.get("phase") or "<pending>"
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
    if phase == "Failed" and ready.get("reason"):
        return f"{phase} ({ready['reason']})"
    return phase


def format_table(rows: Sequence[Mapping[str, str]], all_namespaces: bool) -> str:
    cols = (("NAMESPACE",) if all_namespaces else ()) + COLUMNS
    if not rows:
        return "No VLMServices found."
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["   ".join(c.ljust(widths[c]) for c in cols).rstrip()]
    lines += ["   ".join(r[c].ljust(widths[c]) for c in cols).rstrip() for r in rows]
    return "\n".join(lines)


def action_patch(action: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {ACTION_ANNOTATION: action}}}


def _name(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def check_action(obj: Mapping[str, Any], action: str) -> str:
    """The canary revision the action applies to; PluginError when the operator would ignore it."""
    st = obj.get("status") or {}
    ro = st.get("rollout") or {}
    phase = ro.get("phase")
    if phase not in ACTIVE_PHASES:
        raise PluginError(f"vlmservice {_name(obj)} has no canary in progress (rollout phase {phase or 'none'}); "
                          f"nothing to {action}. Use --force to set the annotation anyway.")
    if action == "pause" and phase == "Paused":
        raise PluginError(f"vlmservice {_name(obj)}: the canary is already paused (kubectl vlm resume to go on)")
    if action == "resume" and phase != "Paused":
        raise PluginError(f"vlmservice {_name(obj)}: the canary is not paused (rollout phase {phase}); nothing to "
                          f"resume. Use --force to set the annotation anyway.")
    return st.get("canaryRevision") or ro.get("revision") or "?"


def check_retry(obj: Mapping[str, Any]) -> str:
    """The held revision that retry lets the operator analyse again."""
    ro = (obj.get("status") or {}).get("rollout") or {}
    if ro.get("phase") not in HELD_PHASES:
        raise PluginError(f"vlmservice {_name(obj)} has no rolled-back or aborted canary to retry (rollout phase "
                          f"{ro.get('phase') or 'none'})")
    return ro.get("revision") or "?"


def retry_patch() -> dict[str, Any]:
    """Merge patch for the status subresource. The operator holds a revision (keeps the stable Deployment,
    starts no canary) while status.rollout names it as RolledBack or Aborted; without status.rollout its
    next reconcile starts the canary of the spec's revision afresh, from step 1 with a new analysis."""
    return {"status": {"rollout": None}}


def proxy_path(namespace: str, pod: str, port: int, view: str) -> str:
    """The API server's pod proxy path for a sidecar endpoint."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{VIEWS.get(view, view)}"


def sidecar_port(pod: Mapping[str, Any], port: int) -> bool:
    return any(p.get("containerPort") == port for c in (pod.get("spec") or {}).get("containers", [])
               for p in c.get("ports") or [])


def parse_against(text: str) -> tuple[str, str | int]:
    """--against: ('role', 'stable'|'baseline'), ('window', ID) or ('pod', NAME)."""
    if text in (names.ROLE_STABLE, names.ROLE_BASELINE):
        return "role", text
    if text.startswith("pod/") and len(text) > 4:
        return "pod", text[4:]
    if text.isdigit():
        return "window", int(text)
    raise PluginError(f"--against {text!r}: use stable, baseline, a window id (GET /windows.json) or pod/NAME")


def pick_baseline_pod(pods: Sequence[Mapping[str, Any]], exclude: str, port: int) -> str | None:
    """A running pod with the sidecar's port, other than the one profiled (first by name: reruns agree)."""
    ok = [p["metadata"]["name"] for p in pods
          if p["metadata"]["name"] != exclude and (p.get("status") or {}).get("phase") == "Running"
          and sidecar_port(p, port)]
    return min(ok) if ok else None


def watch_outcome(obj: Mapping[str, Any]) -> tuple[int | None, str]:
    """(exit code, or None to keep waiting; one line saying where the rollout is)."""
    meta, spec, st = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    name = f"vlmservice/{meta['name']}"
    gen = meta.get("generation")
    if gen is not None and st.get("observedGeneration") != gen:
        return None, f"{name}: waiting for the operator to observe generation {gen}"
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
    if ready.get("reason") == "InvalidSpec":
        return EXIT_NOT_PROMOTED, f"{name}: invalid spec: {ready.get('message', '')}".rstrip(": ")
    ro = st.get("rollout") or {}
    phase, rev = ro.get("phase"), ro.get("revision") or "?"
    why = f" ({ro['reason']}{', ' + ro['regressedFunction'] if ro.get('regressedFunction') else ''})" \
        if ro.get("reason") else ""
    if phase == "Promoted":
        return EXIT_PROMOTED, f"{name}: canary {rev} promoted{why}"
    if phase in HELD_PHASES:
        return EXIT_NOT_PROMOTED, f"{name}: canary {rev} {phase.lower().replace('rolledback', 'rolled back')}{why}"
    if phase in ACTIVE_PHASES:
        steps = len(((spec.get("rollout") or {}).get("steps")) or [None])
        return None, f"{name}: canary {rev} {phase}, step {int(ro.get('step', 0)) + 1}/{steps}" \
                     f"{', verdict ' + ro['verdict'] if ro.get('verdict') else ''}"
    # No rollout for this revision (first deploy, or no rollout block): the stable Deployment rolls in place.
    want, have = spec.get("replicas", 1), st.get("readyReplicas", 0) or 0
    if st.get("phase") == "Ready" and have >= want:
        return EXIT_PROMOTED, f"{name}: ready, {have}/{want} replicas (no canary)"
    if st.get("phase") == "Failed" and ready.get("status") == "False":
        return None, f"{name}: not serving, {have}/{want} replicas ready: {ready.get('reason')}: {ready.get('message', '')}"
    return None, f"{name}: {st.get('phase') or 'pending'}, {have}/{want} replicas ready"


# ---- effects: the API server ----

class Api:
    def __init__(self, kubeconfig: str | None, context: str | None, timeout: float):
        try:
            import urllib3
            from kubernetes import client, config
        except ImportError as e:
            raise PluginError(f"kubectl vlm needs the kubernetes package ({e}): pip install 'vlm-operator[plugin]'") from e

        self.client_mod = client
        # What a request can raise: an HTTP error status, or no answer at all (refused, reset, timed out).
        self.errors = (client.exceptions.ApiException, urllib3.exceptions.HTTPError, OSError)
        try:
            self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
            contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        except (config.ConfigException, FileNotFoundError, OSError) as e:
            raise PluginError(f"cannot load kubeconfig: {e}") from e
        chosen = next((c for c in contexts if c["name"] == context), current) if context else current
        self.default_namespace = (chosen or {}).get("context", {}).get("namespace") or "default"
        self.timeout = timeout

    def _error(self, e: Exception, what: str) -> PluginError:
        status = getattr(e, "status", None)
        body = getattr(e, "body", None) or ""
        try:
            message = json.loads(body).get("message") or body
        except (ValueError, TypeError, AttributeError):
            message = body.decode() if isinstance(body, bytes) else str(body)
        if status == 404 and "the server could not find the requested resource" in str(message):
            return PluginError(f"{what}: the VLMService CRD is not installed (kubectl get crd {PLURAL}.{GROUP})")
        return PluginError(f"{what}: {status or ''} {str(message).strip() or getattr(e, 'reason', e)}".strip())

    def _custom(self):
        return self.client_mod.CustomObjectsApi(self.api)

    def list_services(self, namespace: str | None) -> list[dict]:
        co = self._custom()
        try:
            if namespace is None:
                res = co.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=self.timeout)
            else:
                res = co.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _request_timeout=self.timeout)
        except self.errors as e:
            raise self._error(e, "list vlmservices") from e
        return res.get("items", [])

    def get_service(self, namespace: str, name: str) -> dict:
        try:
            return self._custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                               _request_timeout=self.timeout)
        except self.errors as e:
            if getattr(e, "status", None) == 404 and "could not find" not in str(getattr(e, "body", "")):
                raise NotFound(f"vlmservice {name} not found in namespace {namespace}") from e
            raise self._error(e, f"get vlmservice {namespace}/{name}") from e

    def annotate(self, namespace: str, name: str, action: str) -> None:
        try:
            self._custom().patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, action_patch(action),
                                                          _request_timeout=self.timeout)
        except self.errors as e:
            raise self._error(e, f"annotate vlmservice {namespace}/{name}") from e

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        try:
            self._custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, patch,
                                                                 _request_timeout=self.timeout)
        except self.errors as e:
            if getattr(e, "status", None) == 403:
                raise PluginError(f"patch vlmservices/status {namespace}/{name}: forbidden; retry needs `patch` on "
                                  f"vlmservices/status (kubectl auth can-i patch vlmservices/status -n {namespace})") from e
            raise self._error(e, f"patch status of vlmservice {namespace}/{name}") from e

    def get_pod(self, namespace: str, name: str) -> dict:
        try:
            pod = self.client_mod.CoreV1Api(self.api).read_namespaced_pod(name, namespace, _request_timeout=self.timeout)
        except self.errors as e:
            if getattr(e, "status", None) == 404:
                raise NotFound(f"pod {name} not found in namespace {namespace}") from e
            raise self._error(e, f"get pod {namespace}/{name}") from e
        return self.api.sanitize_for_serialization(pod)

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        try:
            res = self.client_mod.CoreV1Api(self.api).list_namespaced_pod(namespace, label_selector=selector,
                                                                          _request_timeout=self.timeout)
        except self.errors as e:
            raise self._error(e, f"list pods -l {selector} in {namespace}") from e
        return self.api.sanitize_for_serialization(res).get("items", [])

    def proxy(self, method: str, path: str, query: Mapping[str, str] | None = None, body: bytes | None = None) -> bytes:
        """A request through the API server (its auth, its TLS); the body, or PluginError naming the hop."""
        shown = path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        headers = {"Accept": "*/*"}
        if body is not None:
            headers["Content-Type"] = "text/plain"
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            resp = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=self.timeout)
            resp.read()
        except self.errors as e:
            raise PluginError(f"{method} {shown}: no answer from the API server within {self.timeout:g}s "
                              f"({type(e).__name__}: {e})") from e
        if not 200 <= resp.status < 300:
            text = (resp.data or b"").decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError):
                text = json.loads(text).get("message") or text
            raise PluginError(f"{method} {shown}: {resp.status} from the API server's pod proxy: "
                              f"{' '.join(str(text).split())[:500]}")
        return resp.data

    def proxy_get(self, path: str, query: Mapping[str, str] | None = None) -> bytes:
        return self.proxy("GET", path, query)


# ---- commands ----

def cmd_status(api: Api, a: argparse.Namespace) -> int:
    if a.watch:
        return watch(api, a)
    ns = None if a.all_namespaces else (a.namespace or api.default_namespace)
    items = [api.get_service(ns, a.name)] if a.name and ns else api.list_services(ns)
    now = datetime.now(UTC)
    rows = [service_row(o, now) for o in sorted(items, key=lambda o: (o["metadata"].get("namespace", ""),
                                                                      o["metadata"]["name"]))]
    if a.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows, a.all_namespaces))
    return 0


def watch(api: Api, a: argparse.Namespace, sleep=time.sleep, clock=time.monotonic) -> int:
    """Poll one VLMService until its rollout ends; a line per change. Failed requests are retried until
    the deadline (a CI job should not fail on one dropped connection); a missing object is final."""
    if not a.name or a.all_namespaces:
        raise PluginError("status --watch needs one NAME (and no -A)")
    ns = a.namespace or api.default_namespace
    deadline = clock() + a.timeout
    last = ""
    while True:
        try:
            code, line = watch_outcome(api.get_service(ns, a.name))
        except NotFound:
            raise
        except PluginError as e:
            code, line = None, f"vlmservice/{a.name}: {e} (retrying)"
        if line != last:
            print(line, flush=True)
            last = line
        if code is not None:
            return code
        if clock() >= deadline:
            print(f"vlmservice/{a.name}: timed out after {a.timeout:g}s; last: {line}", file=sys.stderr)
            return EXIT_TIMEOUT
        sleep(min(a.interval, max(0.0, deadline - clock())))


def _wait_annotation_cleared(api: Api, ns: str, name: str, action: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj = api.get_service(ns, name)
        if ACTION_ANNOTATION not in (obj["metadata"].get("annotations") or {}):
            ro = (obj.get("status") or {}).get("rollout") or {}
            print(f"vlmservice/{name}: operator acted; rollout phase {ro.get('phase', '-')}"
                  f"{', ' + ro['reason'] if ro.get('reason') else ''}")
            return 0
        time.sleep(0.5)
    raise PluginError(f"vlmservice/{name}: the operator did not take the {action} within {timeout:g}s "
                      f"(is it running and watching namespace {ns}?)")


def cmd_action(api: Api, a: argparse.Namespace) -> int:
    ns = a.namespace or api.default_namespace
    obj = api.get_service(ns, a.name)
    try:
        revision = check_action(obj, a.command)
    except PluginError:
        if not a.force:
            raise
        revision = "?"
    api.annotate(ns, a.name, a.command)
    print(f"vlmservice/{a.name}: {a.command} requested for canary {revision}")
    return _wait_annotation_cleared(api, ns, a.name, a.command, a.wait_timeout) if a.wait else 0


def cmd_retry(api: Api, a: argparse.Namespace) -> int:
    ns = a.namespace or api.default_namespace
    obj = api.get_service(ns, a.name)
    revision = check_retry(obj)
    held = (obj.get("status") or {}).get("rollout") or {}
    api.patch_status(ns, a.name, retry_patch())
    print(f"vlmservice/{a.name}: retry requested for canary {revision} (was {held.get('phase')}"
          f"{', ' + held['reason'] if held.get('reason') else ''})")
    if not a.wait:
        return 0
    deadline = time.monotonic() + a.wait_timeout
    while time.monotonic() < deadline:
        ro = (api.get_service(ns, a.name).get("status") or {}).get("rollout") or {}
        if ro.get("phase") in ACTIVE_PHASES or ro.get("startedAt") not in (None, held.get("startedAt")):
            print(f"vlmservice/{a.name}: operator restarted the canary {ro.get('revision', revision)}; "
                  f"rollout phase {ro.get('phase')}")
            return 0
        if ro == held:
            # A reconcile that read the status before our patch wrote the old rollout back: clear it again.
            api.patch_status(ns, a.name, retry_patch())
        time.sleep(0.5)
    raise PluginError(f"vlmservice/{a.name}: the operator did not restart the canary within {a.wait_timeout:g}s "
                      f"(is it running and watching namespace {ns}?)")


def cmd_profile(api: Api, a: argparse.Namespace) -> int:
    ns = a.namespace or api.default_namespace
    pod = api.get_pod(ns, a.pod)
    if not sidecar_port(pod, a.port):
        raise PluginError(f"pod {ns}/{a.pod} has no container port {a.port}: no profiler sidecar "
                          f"(spec.telemetry.enabled false, or not a VLMService pod)")
    path = proxy_path(ns, a.pod, a.port, a.view)
    query = {"tp_rank": str(a.tp_rank)} if a.tp_rank else {}
    if a.against is not None and a.view != "diff":
        raise PluginError("--against needs --view diff")
    if a.view == "diff":
        kind, ref = parse_against(a.against or "stable")
        if kind == "window":
            body = api.proxy_get(path, {**query, "baseline": str(ref)})
        else:
            base_pod = ref if kind == "pod" else _baseline_pod(api, ns, pod, str(ref), a.port)
            stacks = api.proxy_get(proxy_path(ns, str(base_pod), a.port, COLLAPSED[0]), {**query, **COLLAPSED[1]})
            print(f"baseline: latest window of pod {base_pod} ({len(stacks.splitlines())} stacks)", file=sys.stderr)
            body = api.proxy("POST", path, query, stacks)
    else:
        body = api.proxy_get(path, query)
    if a.view != "json" and b"<svg" not in body[:4096]:
        raise PluginError(f"GET {path}: the answer is not an SVG ({body[:120]!r})")
    out = a.output or f"{a.pod}.{'json' if a.view == 'json' else 'svg'}"
    if out == "-":
        sys.stdout.buffer.write(body)
    else:
        with open(out, "wb") as f:
            f.write(body)
        print(f"wrote {out} ({len(body)} bytes) from {path}", file=sys.stderr)
    return 0


def _baseline_pod(api: Api, ns: str, pod: Mapping[str, Any], role: str, port: int) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    service = labels.get(LABEL_SERVICE)
    if not service:
        raise PluginError(f"pod {ns}/{pod['metadata']['name']} has no {LABEL_SERVICE} label: pass "
                          f"--against pod/NAME or a window id")
    selector = f"{LABEL_SERVICE}={service},{LABEL_ROLE}={role}"
    name = pick_baseline_pod(api.list_pods(ns, selector), pod["metadata"]["name"], port)
    if name is None:
        raise PluginError(f"no running {role} pod of vlmservice {ns}/{service} with the sidecar's port {port} "
                          f"(kubectl get pods -n {ns} -l {selector})")
    return name


def parser() -> argparse.ArgumentParser:
    # Accepted before or after the subcommand (kubectl users type both); SUPPRESS keeps a subparser's
    # unset flag from overwriting the value given before it. Defaults are filled in by `main`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)")
    common.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file (default: KUBECONFIG)")
    common.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context")
    common.add_argument("--request-timeout", type=float, default=argparse.SUPPRESS,
                        help="seconds per API request (default 15)")
    p = argparse.ArgumentParser(prog="kubectl vlm", description=__doc__.splitlines()[0], parents=[common],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n\n")[1].splitlines()))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("status", parents=[common], help="VLMServices with rollout progress and top function")
    s.add_argument("name", nargs="?", help="one VLMService (default: all in the namespace)")
    s.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    s.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")
    s.add_argument("-w", "--watch", action="store_true",
                   help="wait for NAME's rollout to end: exit 0 promoted (or rolled out without a canary), "
                        "1 rolled back, aborted or invalid spec, 2 timeout, 3 error")
    s.add_argument("--timeout", type=float, default=1800.0, help="seconds --watch waits (default 1800)")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between --watch polls (default 2)")
    helps = {"promote": "promote the running canary now", "abort": "abort the canary, keep the stable revision",
             "pause": "pause the canary's analysis (no verdict until resumed)",
             "resume": "resume a paused canary (its step's analysis starts afresh)"}
    for action in names.ROLLOUT_ACTIONS:
        text = helps[action]
        s = sub.add_parser(action, parents=[common], help=text)
        s.add_argument("name", help="the VLMService")
        s.add_argument("--force", action="store_true", help="set the annotation even if the operator would ignore it")
        s.add_argument("--wait", action="store_true", help="wait until the operator has taken the action")
        s.add_argument("--wait-timeout", type=float, default=60.0, help="seconds --wait waits (default 60)")
    s = sub.add_parser("retry", parents=[common],
                       help="analyse a rolled-back or aborted revision again (clears status.rollout; needs "
                            "patch on vlmservices/status)")
    s.add_argument("name", help="the VLMService")
    s.add_argument("--wait", action="store_true", help="wait until the operator has restarted the canary")
    s.add_argument("--wait-timeout", type=float, default=60.0, help="seconds --wait waits (default 60)")
    s = sub.add_parser("profile", parents=[common], help="flamegraph of a pod's profiler sidecar (pod proxy)")
    s.add_argument("pod", help="a VLMService pod (with the profiler sidecar)")
    s.add_argument("-o", "--output", default=None, help="file to write (default POD.svg or POD.json; - for stdout)")
    s.add_argument("--view", choices=sorted(VIEWS), default="svg",
                   help="svg: latest flamegraph (default); json: speedscope JSON; diff: latest vs --against")
    s.add_argument("--against", default=None,
                   help="diff baseline: stable (default: a stable pod's latest window), baseline (a fresh-baseline "
                        "pod's), a window id of this pod (its /windows.json), or pod/NAME")
    s.add_argument("--tp-rank", type=int, default=0, help="tensor-parallel rank's scheduler (default 0)")
    s.add_argument("--port", type=int, default=SIDECAR_PORT, help=f"sidecar port (default {SIDECAR_PORT})")
    return p


COMMANDS = {"status": cmd_status, "promote": cmd_action, "abort": cmd_action, "pause": cmd_action,
            "resume": cmd_action, "retry": cmd_retry, "profile": cmd_profile}


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    for key, default in (("namespace", None), ("kubeconfig", None), ("context", None), ("request_timeout", 15.0)):
        if not hasattr(a, key):
            setattr(a, key, default)
    watching = a.command == "status" and a.watch
    try:
        api = Api(a.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None, a.context,
                  a.request_timeout)
        return COMMANDS[a.command](api, a)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR if watching else 1  # with --watch, 1 means "rolled back"
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
