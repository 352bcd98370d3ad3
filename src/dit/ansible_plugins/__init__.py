"""Controller-side Ansible plugin code (imported by the thin files under ``action_plugins/``)."""
