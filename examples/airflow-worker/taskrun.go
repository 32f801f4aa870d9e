package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/exactlyonce/dedupe"
)

// The environment Airflow exports to every task (BashOperator, KubernetesPodOperator
// with the context forwarded, or @task.bash).
const (
	envDagID    = "AIRFLOW_CTX_DAG_ID"
	envTaskID   = "AIRFLOW_CTX_TASK_ID"
	envRunID    = "AIRFLOW_CTX_DAG_RUN_ID"
	envTry      = "AIRFLOW_CTX_TRY_NUMBER"     // read for logs only: it changes on every retry
	envLogical  = "AIRFLOW_CTX_LOGICAL_DATE"   // Airflow 3
	envExecDate = "AIRFLOW_CTX_EXECUTION_DATE" // Airflow 2
)

// TaskRun is one logical run of an Airflow task: what every try of it shares.
type TaskRun struct {
	DagID, TaskID, RunID string
	// MapIndex is the index of a mapped task instance, or -1.
	MapIndex int
	// LogicalDate is the run's logical (execution) date as Airflow gives it,
	// or "".
	LogicalDate string
	// Try is the try number. It is logged and recorded, never part of the
	// key: a key per try would let every retry write again.
	Try int
}

// taskRunFromEnv reads the task's identity from Airflow's environment.
func taskRunFromEnv(getenv func(string) string, mapIndex int) (TaskRun, error) {
	r := TaskRun{
		DagID: getenv(envDagID), TaskID: getenv(envTaskID), RunID: getenv(envRunID),
		MapIndex: mapIndex, LogicalDate: getenv(envLogical),
	}
	if r.LogicalDate == "" {
		r.LogicalDate = getenv(envExecDate)
	}
	for _, name := range []string{envDagID, envTaskID, envRunID} {
		if getenv(name) == "" {
			return TaskRun{}, fmt.Errorf("%w: %s is not set (is this started by an Airflow task?)", errNoContext, name)
		}
	}
	if t := getenv(envTry); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return TaskRun{}, fmt.Errorf("%w: %s=%q is not a number", errNoContext, envTry, t)
		}
		r.Try = n
	}
	return r, nil
}

// Key returns the dedup key of the logical run: dag_id/task_id/run_id, plus
// the map index of a mapped task, never the try number. Airflow's dag and
// task ids hold no "/", so the parts cannot run into each other; a key over
// dedupe.MaxKeyLen bytes (ids may be 250 characters each) is replaced by a
// hash of its parts, equally stable.
func (r TaskRun) Key() string {
	k := r.DagID + "/" + r.TaskID + "/" + r.RunID
	if r.MapIndex >= 0 {
		k += "/" + strconv.Itoa(r.MapIndex)
	}
	if len(k) <= dedupe.MaxKeyLen {
		return k
	}
	h := sha256.New()
	var n [8]byte
	for _, part := range []string{r.DagID, r.TaskID, r.RunID, strconv.Itoa(r.MapIndex)} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
