"""What the appliance shows of itself: metrics, their files, traces and logs."""
