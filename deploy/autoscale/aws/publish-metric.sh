#!/bin/sh
# Publish this box's lchat_fleet_desired_boxes to CloudWatch as a ratio to the group's
# in-service count, every 60 s (cron, or a systemd timer). Target tracking at 1.0 then
# holds the group at the fleet's desired count. Needs the AWS CLI and an instance role
# allowed cloudwatch:PutMetricData and autoscaling:DescribeAutoScalingGroups.
set -eu
group=${LCHAT_ASG_NAME:?set LCHAT_ASG_NAME to the Auto Scaling group}
desired=$(curl -fsS http://localhost:2019/metrics | awk '$1 == "lchat_fleet_desired_boxes" {print $2}')
running=$(aws autoscaling describe-auto-scaling-groups --auto-scaling-group-names "$group" \
	--query 'length(AutoScalingGroups[0].Instances[?LifecycleState==`InService`])' --output text)
[ "${running:-0}" -gt 0 ] || exit 0
aws cloudwatch put-metric-data --namespace lchat --metric-name lchat_fleet_desired_boxes_per_box \
	--dimensions AutoScalingGroupName="$group" \
	--value "$(awk -v d="$desired" -v r="$running" 'BEGIN {print d / r}')"
