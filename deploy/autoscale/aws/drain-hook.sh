#!/bin/sh
# Run on the box by the instance-terminating lifecycle hook (through EventBridge and SSM
# Run Command, or a watcher polling the instance's target lifecycle state): stop the box,
# which drains (heartbeat marked draining, spaces checkpointed, leases released, heartbeat
# deleted), then let the group terminate it. The hook's heartbeat timeout must exceed the
# drain (drain_timeout, 60s by default).
set -eu
group=${LCHAT_ASG_NAME:?}
instance=$(curl -fsS http://169.254.169.254/latest/meta-data/instance-id)
systemctl stop lchat-caddy
aws autoscaling complete-lifecycle-action --auto-scaling-group-name "$group" \
	--lifecycle-hook-name lchat-drain --instance-id "$instance" --lifecycle-action-result CONTINUE
