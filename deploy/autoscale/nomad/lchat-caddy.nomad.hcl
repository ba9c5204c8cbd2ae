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

    task "lchat-caddy" {
      driver = "exec"
      # A stop drains (checkpoints and releases every awake space): give it the time.
      kill_timeout = "120s"
      config {
        command = "/usr/local/bin/lchat-caddy"
        args    = ["run", "--config", "/etc/lchat/Caddyfile"]
      }
      resources {
        memory = 8192
      }
    }
  }
}
