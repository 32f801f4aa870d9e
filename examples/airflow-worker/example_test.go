package main

import "fmt"

// The key names the logical run; the try number is not part of it.
func ExampleTaskRun_Key() {
	env := map[string]string{
		"AIRFLOW_CTX_DAG_ID":     "payouts_daily",
		"AIRFLOW_CTX_TASK_ID":    "credit_payouts",
		"AIRFLOW_CTX_DAG_RUN_ID": "scheduled__2026-01-01T00:00:00+00:00",
		"AIRFLOW_CTX_TRY_NUMBER": "3",
	}
	r, err := taskRunFromEnv(func(k string) string { return env[k] }, -1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Key(), "try", r.Try)
	// Output: payouts_daily/credit_payouts/scheduled__2026-01-01T00:00:00+00:00 try 3
}
