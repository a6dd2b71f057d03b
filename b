29887 29887 trainctl 50 1 build/src/trainctl_run_/tmp/wk/job.yaml_--set_output_dir=/tm
29887 29889 trainctl 66 4 build/src/trainctl_run_/tmp/wk/job.yaml_--set_output_dir=/tm
29890 29890 trainctl 80 10 /work/main/build/src/trainctl_--log-level_info_agent_--run-i
29890 29893 trainctl 3 0 /work/main/build/src/trainctl_--log-level_info_agent_--run-i
29891 29891 trainctl 246 212 /work/main/build/src/trainctl_--log-level_info_train_
29892 29892 trainctl 167 443 /work/main/build/src/trainctl_--log-level_info_train_
