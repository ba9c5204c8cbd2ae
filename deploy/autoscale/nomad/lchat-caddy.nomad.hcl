# lchat-caddy boxes as a Nomad job, scaled by the Nomad Autoscaler on the fleet's own
# signal, lchat_fleet_desired_boxes, read from Prometheus (every box reports the same
# value; max() takes one).
job "lchat-caddy" {
  group "boxes" {
    count = 2

    scaling {
      enabled = true
      min     = 2
      max     = 50

      policy {
        evaluation_interval = "30s"
        cooldown            = "2m"

        check "desired_boxes" {
          source = "prometheus"
          query  = "max(lchat_fleet_desired_boxes)"

          strategy "pass-through" {}
        }
      }
    }

    network {
      port "https" { static = 443 }
      # lchat_health (LCHAT_HEALTH_PORT): 200 only while the box serves, 503 from the
      # first moment of a stop.
      port "health" { static = 8081 }
    }

    # The balancer in front (Consul- or Nomad-service-discovered) takes a box out when its
    # check fails; shutdown_delay deregisters it before the task is signalled. No
    # check_restart: a draining or fenced box fails the check and must not be restarted.
    shutdown_delay = "10s"

    service {
      name     = "lchat-caddy"
      provider = "nomad"
      port     = "https"
      check {
        type     = "http"
        port     = "health"
        path     = "/"
        interval = "2s"
        timeout  = "1s"
      }
    }

    task "lchat-caddy" {
      driver = "exec"
      # A stop drains (checkpoints and releases every awake space): give it the time.
      kill_timeout = "120s"
      config {
        command = "/usr/local/bin/lchat-caddy"
        args    = ["run", "--config", "/etc/lchat/Caddyfile"]
      }
      env {
        LCHAT_SHUTDOWN_DELAY = "10s"
      }
      resources {
        memory = 8192
      }
    }
  }
}
