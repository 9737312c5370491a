# gpuk8s's JupyterHub configuration, shipped in ConfigMap hub-config next to gpuk8s.json (the
# values gpuk8s computed: users, admins, profiles, timeouts). This file is fixed text: nothing of
# the inventory or the values is ever written into it; it reads them from the JSON.
#
# Wiring as Zero to JupyterHub 4.4.0 does it (jupyterhub/files/hub/jupyterhub_config.py@4.4.0):
# the proxy runs in its own pod (should_start False, api_url the proxy-api Service, token from
# CONFIGPROXY_AUTH_TOKEN), the hub binds :8081 and is reached at the hub Service, the idle
# culler runs as a hub-managed service. Different from the chart: each user's servers run in
# that user's own namespace (gpuk8s's tenancy), so their GPUs count against that user's
# ResourceQuota, with one KubeSpawner reflector per namespace (kubespawner/spawner.py@7.0.0
# _start_reflector: no cluster-wide rights needed for that mode).
import json
import os
import sys

from kubespawner import KubeSpawner

HERE = "/usr/local/etc/jupyterhub"
with open(os.path.join(HERE, "gpuk8s.json"), encoding="utf-8") as f:
    settings = json.load(f)

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)


class UserNamespaceSpawner(KubeSpawner):
    """KubeSpawner with each user's servers in the namespace named after the user."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the namespace is saved in the spawner's state (get_state) and restored over this by
        # load_state for a server that was started before
        self.namespace = self.user.name
        self.dns_name = self.dns_name_template.format(namespace=self.namespace,
                                                      name=self.pod_name)


# -- hub and proxy -------------------------------------------------------------------------------
hub_ns = os.environ["POD_NAMESPACE"]
c.JupyterHub.spawner_class = UserNamespaceSpawner
c.JupyterHub.hub_bind_url = "http://:8081"
# the singleuser servers are in other namespaces: the hub's fully qualified Service name
c.JupyterHub.hub_connect_url = f"http://hub.{hub_ns}.svc.cluster.local:8081"
c.ConfigurableHTTPProxy.should_start = False
c.ConfigurableHTTPProxy.api_url = f"http://proxy-api.{hub_ns}.svc.cluster.local:8001"
c.JupyterHub.cleanup_servers = False
# the default server plus named ones (JupyterHub counts only the named; 0 would be no limit)
c.JupyterHub.allow_named_servers = settings["serversPerUser"] > 1
c.JupyterHub.named_server_limit_per_user = max(1, settings["serversPerUser"] - 1)
c.JupyterHub.last_activity_interval = 60
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"
# the proxy terminates HTTPS; the hub's cookies are only sent over it
c.JupyterHub.cookie_options = {"secure": True}

# -- who may sign in ----------------------------------------------------------------------------
# NativeAuthenticator (jupyterhub-nativeauthenticator 1.3.0, pinned by z2jh 4.4.0's hub image):
# each user signs up once at /hub/signup with a password of their own (stored bcrypt-hashed in
# the hub's database). Only the inventory's users are allowed (JupyterHub 5 refuses everyone
# else at login), their sign-up is authorised at once, and nobody else's ever is.
c.JupyterHub.authenticator_class = "native"
c.Authenticator.allowed_users = set(settings["users"])
c.Authenticator.admin_users = set(settings["admins"])
c.NativeAuthenticator.open_signup = False
c.NativeAuthenticator.minimum_password_length = 10
c.NativeAuthenticator.check_common_password = True
c.NativeAuthenticator.allowed_failed_logins = 5
c.NativeAuthenticator.seconds_before_next_try = 60

# -- the servers --------------------------------------------------------------------------------
c.KubeSpawner.image = settings["image"]
c.KubeSpawner.image_pull_policy = settings["imagePullPolicy"]
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.uid = 1000
c.KubeSpawner.gid = 100
c.KubeSpawner.fs_gid = 100
c.KubeSpawner.start_timeout = settings["startTimeout"]
c.KubeSpawner.http_timeout = 120
c.KubeSpawner.cpu_guarantee = settings["cpu"]
c.KubeSpawner.mem_guarantee = settings["memory"]
c.KubeSpawner.mem_limit = settings["memory"]
c.KubeSpawner.container_security_context = {
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
c.KubeSpawner.environment = {"NVIDIA_VISIBLE_DEVICES": "void"}  # a CPU server sees no GPU
c.KubeSpawner.profile_list = settings["profiles"]
# undeploy finds the servers and their claims in the users' namespaces by this label
c.KubeSpawner.extra_labels = {"gpuk8s.io/workload": "jupyterhub"}
c.KubeSpawner.storage_extra_labels = {"gpuk8s.io/workload": "jupyterhub"}
if settings["nodeSelector"]:
    c.KubeSpawner.node_selector = settings["nodeSelector"]

homes = settings["homes"]
if homes["enabled"]:
    # claim-{username}: bound to the user's own NFS volume (made by gpuk8s) or, with a storage
    # class, provisioned by it
    c.KubeSpawner.storage_pvc_ensure = True
    c.KubeSpawner.pvc_name_template = "claim-{username}"
    c.KubeSpawner.storage_class = homes["storageClassName"]
    c.KubeSpawner.storage_access_modes = [homes["accessMode"]]
    c.KubeSpawner.storage_capacity = homes["size"]
    c.KubeSpawner.volumes = [{"name": "home",
                              "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]

# -- idle servers -------------------------------------------------------------------------------
# every server: the hub's culler (jupyterhub-idle-culler 1.4.0, as z2jh runs it); GPU servers
# also stop themselves sooner (jupyter_server's shutdown_no_activity_timeout; the profile's
# args), since a notebook holding a GPU for days is what the lab's users ask about most
if settings["idleTimeout"] > 0:
    c.JupyterHub.load_roles = [{
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"]}]
    c.JupyterHub.services = [{
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                    "--url=http://localhost:8081/hub/api",
                    f"--timeout={settings['idleTimeout']}",
                    f"--cull-every={settings['cullEvery']}", "--concurrency=10"]}]
