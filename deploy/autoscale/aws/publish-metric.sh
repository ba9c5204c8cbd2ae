#!/bin/sh
# Publish this box's lchat_fleet_desired_boxes to CloudWatch as a ratio to the group's
# in-service count, every 60 s (cron, or a systemd timer). Target tracking at 1.0 then
# holds the group at the fleet's desired count. Needs the AWS CLI and an instance role
# allowed cloudwatch:PutMetricData and autoscaling:DescribeAutoScalingGroups. Run it as
# root: it reads the metrics from the admin API on the Unix socket of mesh.Caddyfile
# (LCHAT_ADMIN_LISTEN, when set, moves it). The dimension is the one target-tracking.json
# names: CloudWatch tells metrics apart by their dimensions.
set -eu
group=${LCHAT_ASG_NAME:?set LCHAT_ASG_NAME to the Auto Scaling group}
desired=$(curl -fsS --unix-socket /run/lchat-caddy/admin.sock http://localhost/metrics |
	awk '$1 == "lchat_fleet_desired_boxes" {print $2}')
[ -n "$desired" ] || { echo "no lchat_fleet_desired_boxes in the box's metrics" >&2; exit 1; }
running=$(aws autoscaling describe-auto-scaling-groups --auto-scaling-group-names "$group" \
	--query 'length(AutoScalingGroups[0].Instances[?LifecycleState==`InService`])' --output text)
[ "${running:-0}" -gt 0 ] || exit 0
aws cloudwatch put-metric-data --namespace lchat --metric-name lchat_fleet_desired_boxes_per_box \
	--dimensions AutoScalingGroupName="$group" \
	--value "$(awk -v d="$desired" -v r="$running" 'BEGIN {print d / r}')"
