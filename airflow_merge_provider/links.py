"""Extra links of a merge task: its Spark application's UI and its driver's log, where they have an address.

The operator pushes each link's URL as XCom under the link's own key while the task runs (as soon as the
driver's log names its application), so the button works during the merge; Airflow's task runner pushes
:meth:`get_link`'s value again when the task ends. A link with no known address is left empty: it is never
guessed. What each master allows:

=============  ==========================================================  ================================
master         Spark UI                                                    driver log
=============  ==========================================================  ================================
``local``      the driver's own UI, ``http://<driver host>:<port>``       (the task log)
``spark://``   the master's application page,                             (the task log: client mode)
               ``http://<master host>:8080/app/?appId=<app id>``
               (the master web UI's default port)
``yarn``       ``<RM>/proxy/<application id>/``                            cluster mode: ``<RM>/cluster/app/
                                                                           <application id>`` (its logs)
``k8s://``     cluster mode: none (the driver pod's UI has no address      none
               outside the cluster)
=============  ==========================================================  ================================

In client mode, where no page above applies, the driver's own UI is linked while the driver runs (it dies
with the driver: a deferred task, which learns of its application only at the end, does not link it).

``<RM>`` is the Spark connection's ``yarn_resourcemanager_webapp_address`` extra (the apache-spark
provider's); without it YARN links are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_merge_provider.driver_output import SparkApplication

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["SparkApplicationUiLink", "SparkDriverLogLink", "application_links", "push_links"]

STANDALONE_MASTER_UI_PORT = 8080


class _PushedLink(BaseOperatorLink):
    """A link whose URL the operator pushed as XCom under the link's key."""

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # In the worker, the task that ran knows what it pushed: no request for a link it never had.
        pushed = getattr(operator, "pushed_links", None)
        if isinstance(pushed, dict):
            return str(pushed.get(self.xcom_key, ""))
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return value if isinstance(value, str) else ""


class SparkApplicationUiLink(_PushedLink):
    """The merge's Spark application UI (see the module's table)."""

    name = "Spark UI"


class SparkDriverLogLink(_PushedLink):
    """The merge driver's log, where the cluster serves it (YARN cluster mode); in client mode the driver's
    output is in the task log."""

    name = "Spark driver log"


def application_links(
    application: SparkApplication, *, master: str, deploy_mode: str, yarn_rm_url: str | None, live: bool
) -> dict[str, str]:
    """The URL of each link (by its XCom key) that ``application`` and the connection give an address.

    :param master: the Spark master URL (``local[*]``, ``spark://h:7077``, ``yarn``, ``k8s://...``).
    :param deploy_mode: ``client`` or ``cluster``.
    :param yarn_rm_url: the YARN ResourceManager's web address, if the connection has one.
    :param live: whether the driver still runs (its own UI dies with it).
    """
    ui: str | None = None
    log: str | None = None
    app_id = application.app_id
    if master.startswith("spark://"):
        host = urlsplit("spark://" + master.removeprefix("spark://").split(",")[0]).hostname
        if app_id is not None and host:
            ui = f"http://{host}:{STANDALONE_MASTER_UI_PORT}/app/?appId={quote(app_id)}"
    elif master.startswith("yarn") and app_id is not None and yarn_rm_url:
        rm = yarn_rm_url.rstrip("/")
        rm = rm if "://" in rm else f"http://{rm}"
        ui = f"{rm}/proxy/{quote(app_id)}/"
        log = f"{rm}/cluster/app/{quote(app_id)}" if deploy_mode == "cluster" else None
    if ui is None and live and deploy_mode == "client":
        ui = application.ui_url  # the driver runs on this worker
    links = {SparkApplicationUiLink().xcom_key: ui, SparkDriverLogLink().xcom_key: log}
    return {key: url for key, url in links.items() if url is not None}


def push_links(context: Context, urls: Mapping[str, str], pushed: dict[str, str], *, log: Any) -> None:
    """Push each URL as XCom under its link's key, once (``pushed`` records what was), and an empty one for
    a link pushed before that ``urls`` no longer has (a driver UI gone with its driver). A link that cannot
    be pushed is logged, never fails the merge (an XCom backend or API hiccup must not stop a running job).
    """
    urls = {**dict.fromkeys((key for key, url in pushed.items() if url), ""), **urls}
    for key, url in urls.items():
        if pushed.get(key, "") == url:
            continue
        try:
            context["ti"].xcom_push(key=key, value=url)
        except Exception as error:
            log.warning("Could not record the link %s (%s): %s", key, url, error)
            continue
        pushed[key] = url
        if url:
            log.info("Spark application link: %s", url)
