// Package sandbox holds what keeps one space's instance away from the box and from the
// other spaces: a stable unprivileged uid/gid per space (UIDs), the capability check a box
// must pass before it switches uids (MissingCaps), and one cgroup per space (Cgroups,
// Group) that holds every descendant of the instance, enforces its limits and ends them
// all at once. It has no Caddy glue; the engine drives it.
package sandbox
