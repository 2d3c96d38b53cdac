"""The fake project's VPC: its networks and their firewall rules, and whether SSH gets through.

Every project starts as Google Cloud creates one with the Compute Engine API: the auto-mode
``default`` network with its four pre-populated ingress rules (Cloud NGFW docs, "Pre-populated rules
in the default network": ``default-allow-internal`` from 10.128.0.0/9, ``default-allow-ssh`` tcp:22,
``default-allow-rdp`` tcp:3389 and ``default-allow-icmp`` from 0.0.0.0/0, all at priority 65534).
A network made any other way has no rule: only the implied ones (deny all ingress, allow all
egress, priority 65535). The state lives in the ``vpc`` document, per project, written the first
time a command changes it.

How a packet is judged (Cloud NGFW "Firewall rule priority"): of the enabled ingress rules of the
VM's network that apply to it and match the source and port, the one with the lowest priority
number wins, a deny winning over an allow at the same priority; none matching is the implied deny.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore, StateTxn

DOC = "vpc"
DEFAULT_NETWORK = "default"
DEFAULT_PRIORITY = 1000  # firewalls_utils.AddCommonArgs: --priority "Default is 1000"
# Where the fake ``gcloud compute ssh`` connects from: the worker's public address (RFC 5737
# TEST-NET-3), and IAP's TCP forwarding range for ``--tunnel-through-iap``.
CALLER_ADDRESS = "203.0.113.7"
IAP_ADDRESS = "35.235.240.1"  # in 35.235.240.0/20 (IAP TCP forwarding docs)


def _rule(name: str, sources: list[str], allowed: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "network": DEFAULT_NETWORK,
        "direction": "INGRESS",
        "priority": 65534,
        "sourceRanges": sources,
        "allowed": allowed,
        "disabled": False,
    }


def default_vpc() -> dict[str, Any]:
    """A new project's VPC: the ``default`` network and its pre-populated rules."""
    return {
        "networks": {DEFAULT_NETWORK: {"name": DEFAULT_NETWORK, "autoCreateSubnetworks": True}},
        "firewalls": {
            rule["name"]: rule
            for rule in (
                _rule(
                    "default-allow-internal",
                    ["10.128.0.0/9"],
                    [
                        {"IPProtocol": "tcp", "ports": ["0-65535"]},
                        {"IPProtocol": "udp", "ports": ["0-65535"]},
                        {"IPProtocol": "icmp"},
                    ],
                ),
                _rule("default-allow-ssh", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["22"]}]),
                _rule("default-allow-rdp", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["3389"]}]),
                _rule("default-allow-icmp", ["0.0.0.0/0"], [{"IPProtocol": "icmp"}]),
            )
        },
    }


def read_vpc(store: StateStore, project: str) -> dict[str, Any]:
    """The project's networks and firewall rules (a copy; the default VPC if never changed)."""
    found = store.read(DOC).get(project)
    return copy.deepcopy(found) if found is not None else default_vpc()


def vpc_for_update(txn: StateTxn, project: str) -> dict[str, Any]:
    """The project's VPC inside ``txn``, to change (then ``txn.save(DOC)``)."""
    return txn.doc(DOC).setdefault(project, default_vpc())


def delete_network(layout: SandboxLayout, project: str, network: str) -> None:
    """What deleting a network's firewall rules and then the network leaves (a test's set-up)."""
    with StateStore(layout).txn() as txn:
        vpc = vpc_for_update(txn, project)
        vpc["networks"].pop(network, None)
        vpc["firewalls"] = {k: r for k, r in vpc["firewalls"].items() if r.get("network") != network}
        txn.save(DOC)


def _port_in(entry: dict[str, Any], port: int) -> bool:
    if str(entry.get("IPProtocol")) not in ("tcp", "all"):
        return False
    ports = entry.get("ports") or []
    if not ports:
        return True
    for item in ports:
        low, _, high = str(item).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _matches(rule: dict[str, Any], network: str, source: str, port: int, key: str) -> bool:
    if (
        rule.get("network") != network
        or rule.get("direction", "INGRESS") != "INGRESS"
        or rule.get("disabled")
    ):
        return False
    if rule.get("targetTags") or rule.get("targetServiceAccounts"):
        return False  # the VMs the sandbox creates carry no tags; their account is never targeted
    address = ipaddress.ip_address(source)
    if not any(address in ipaddress.ip_network(r, strict=False) for r in rule.get("sourceRanges") or []):
        return False
    return any(_port_in(entry, port) for entry in rule.get(key) or [])


def ingress_allowed(vpc: dict[str, Any], network: str, source: str, port: int) -> bool:
    """Whether a connection from ``source`` to ``port`` of a VM on ``network`` gets in."""
    verdicts = []
    for rule in vpc["firewalls"].values():
        priority = int(rule.get("priority", DEFAULT_PRIORITY))
        if _matches(rule, network, source, port, "denied"):
            verdicts.append((priority, 0, False))  # deny sorts first at the same priority
        if _matches(rule, network, source, port, "allowed"):
            verdicts.append((priority, 1, True))
    return min(verdicts)[2] if verdicts else False  # implied deny-all ingress


def network_url(project: str, name: str) -> str:
    return f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{name}"


def network_resource(project: str, record: dict[str, Any]) -> dict[str, Any]:
    """A Compute API Network."""
    return {
        "kind": "compute#network",
        "name": record["name"],
        "autoCreateSubnetworks": record.get("autoCreateSubnetworks", True),
        "routingConfig": {"routingMode": "REGIONAL"},
        "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL",
        "selfLink": network_url(project, record["name"]),
    }


def firewall_resource(project: str, rule: dict[str, Any]) -> dict[str, Any]:
    """A Compute API Firewall (``network`` as its URL)."""
    resource = {
        "kind": "compute#firewall",
        "logConfig": {"enable": False},
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/firewalls/{rule['name']}",
        **{k: v for k, v in rule.items() if v not in (None, [], "")},
    }
    resource["network"] = network_url(project, rule["network"])
    resource.setdefault("priority", DEFAULT_PRIORITY)
    resource.setdefault("disabled", False)
    return resource
