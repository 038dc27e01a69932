// Package deploy holds no code: its directory carries the files that run
// pgquic in production (systemd unit, container build file, compose file,
// Kubernetes manifests, Prometheus scrape configuration and Grafana
// dashboard), and its tests check those files against the binary, so a
// renamed flag, port or metric breaks the build instead of a deployment.
package deploy
