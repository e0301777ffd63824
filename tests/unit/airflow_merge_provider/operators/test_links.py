"""Extra links: the address each master gives a merge's Spark application, and what a link reads back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_merge_provider.driver_output import SparkApplication
from airflow_merge_provider.links import SparkApplicationUiLink, SparkDriverLogLink, application_links
from airflow_merge_provider.operators.merge_into import MergeIntoOperator

UI, LOG = SparkApplicationUiLink().xcom_key, SparkDriverLogLink().xcom_key
LOCAL = SparkApplication(ui_port=4040, driver_host="10.0.0.5")


@pytest.mark.parametrize(
    ("application", "master", "deploy_mode", "rm", "live", "expected"),
    [
        (LOCAL, "local[*]", "client", None, True, {UI: "http://10.0.0.5:4040"}),
        (LOCAL, "local[*]", "client", None, False, {}),  # the driver's own UI died with it
        (
            SparkApplication(app_id="app-20240102-0001", ui_port=4040, driver_host="w1"),
            "spark://spark-master:7077,spare:7077", "client", None, False,
            {UI: "http://spark-master:8080/app/?appId=app-20240102-0001"},
        ),
        (SparkApplication(ui_port=4040, driver_host="w1"), "spark://m:7077", "client", None, True,
         {UI: "http://w1:4040"}),
        (
            SparkApplication(app_id="application_1_0042"), "yarn", "cluster", "rm.example:8088", False,
            {UI: "http://rm.example:8088/proxy/application_1_0042/",
             LOG: "http://rm.example:8088/cluster/app/application_1_0042"},
        ),
        (SparkApplication(app_id="application_1_0042"), "yarn", "client", "https://rm/", False,
         {UI: "https://rm/proxy/application_1_0042/"}),
        (SparkApplication(app_id="application_1_0042"), "yarn", "cluster", None, False, {}),
        (SparkApplication(app_id="spark-abc"), "k8s://https://kube:443", "cluster", None, True, {}),
    ],
)  # fmt: skip
def test_links_by_master(
    application: SparkApplication, master: str, deploy_mode: str, rm: str | None, live: bool,
    expected: dict[str, str],
) -> None:  # fmt: skip
    assert application_links(application, master=master, deploy_mode=deploy_mode, yarn_rm_url=rm,
                             live=live) == expected  # fmt: skip


def test_a_link_reads_its_url_back_from_xcom(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    stored = {(UI, "merge"): "http://10.0.0.5:4040"}

    def get_value(*, ti_key: Any, key: str) -> Any:
        return stored.get((key, ti_key.task_id))

    monkeypatch.setattr(XCom, "get_value", get_value)
    ti_key: Any = SimpleNamespace(task_id="merge")
    operator: Any = SimpleNamespace()  # as deserialized elsewhere: not the instance that ran
    assert SparkApplicationUiLink().get_link(operator, ti_key=ti_key) == "http://10.0.0.5:4040"
    assert SparkDriverLogLink().get_link(operator, ti_key=ti_key) == ""
    # The instance that ran answers from what it pushed, without asking the API server.
    ran: Any = SimpleNamespace(pushed_links={LOG: "http://rm/cluster/app/application_1_1"})
    assert SparkApplicationUiLink().get_link(ran, ti_key=ti_key) == ""
    assert SparkDriverLogLink().get_link(ran, ti_key=ti_key) == "http://rm/cluster/app/application_1_1"


def test_the_operator_declares_both_links() -> None:
    names = [link.name for link in MergeIntoOperator.operator_extra_links]
    assert names == ["Spark UI", "Spark driver log"]
