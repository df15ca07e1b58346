"""The Kubernetes Pod Security Standards "restricted" profile as checks on a pod spec.

From https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the baseline
controls plus the restricted ones), for what the Pod Security admission controller enforces in
a namespace labelled ``pod-security.kubernetes.io/enforce: restricted``. Returns the violations
as messages; empty means the pod is admitted.
"""

from __future__ import annotations

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict) -> list[str]:
    """Violations of the restricted profile by a pod spec (a Pod's or a pod template's spec)."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    containers = [(kind, c) for kind in ("initContainers", "containers", "ephemeralContainers")
                  for c in pod.get(kind) or []]
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(f):
            out.append(f"{f} must be unset or false")
    for v in pod.get("volumes") or []:
        source = next((k for k in v if k != "name"), "emptyDir")  # no source: the API defaults emptyDir
        if source not in RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')}: type {source} is not allowed")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {s.get('name')} is not allowed")
    if psc.get("runAsUser") == 0:
        out.append("securityContext.runAsUser must not be 0")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("securityContext.seccompProfile.type must not be Unconfined")
    if (psc.get("seLinuxOptions") or {}).get("type") not in SELINUX_TYPES:
        out.append("securityContext.seLinuxOptions.type is not allowed")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("securityContext.windowsOptions.hostProcess must be false")
    for kind, c in containers:
        where = f"{kind}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}: privileged must be unset or false")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: securityContext.allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: securityContext.capabilities.drop must include ALL")
        for cap in caps.get("add") or []:
            if cap != "NET_BIND_SERVICE":
                out.append(f"{where}: capability {cap} may not be added")
            elif cap not in BASELINE_CAPS:
                out.append(f"{where}: capability {cap} is not in the baseline set")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (pod or container)")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{where}: procMount must be Default")
        if (sc.get("seLinuxOptions") or {}).get("type") not in SELINUX_TYPES:
            out.append(f"{where}: seLinuxOptions.type is not allowed")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{where}: hostPort must be unset or 0")
    return out
