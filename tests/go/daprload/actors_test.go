package daprload

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dapr/go-sdk/actor"
	dapr "github.com/dapr/go-sdk/client"
)

const counterType = "LoadCounter"

// Counter is an actor whose state is one number (exported: the SDK finds its methods by
// reflection and skips unexported types). Each call reads the number from the actor
// state store and saves the new one in a transaction, both through daprd: the SDK's state
// manager would keep the value cached in the activation after its first read, and the point
// is what the store does per call.
type Counter struct {
	actor.ServerImplBaseCtx
}

// actorClient is the client the actors call daprd with, set once daprd answers: the SDK
// makes an actor when the type is registered, before daprd runs, so none can connect then.
var actorClient dapr.Client

func newCounter() actor.ServerContext {
	return &Counter{}
}

func (c *Counter) Type() string { return counterType }

// Add adds n to the count and answers the new count.
func (c *Counter) Add(ctx context.Context, n int) (int, error) {
	got, err := actorClient.GetActorState(ctx, &dapr.GetActorStateRequest{ActorType: counterType, ActorID: c.ID(), KeyName: "count"})
	if err != nil {
		return 0, err
	}
	count := 0
	if len(got.Data) > 0 {
		if count, err = strconv.Atoi(string(got.Data)); err != nil {
			return 0, fmt.Errorf("stored count %q: %w", got.Data, err)
		}
	}
	count += n
	err = actorClient.SaveStateTransactionally(ctx, counterType, c.ID(), []*dapr.ActorStateOperation{
		{OperationType: "upsert", Key: "count", Value: []byte(strconv.Itoa(count))},
	})
	return count, err
}

// Get answers the stored count.
func (c *Counter) Get(ctx context.Context) (int, error) {
	return c.Add(ctx, 0)
}

// actors makes calls calls of Add(1) over ids actor ids (id i gets calls i, i+ids, ...),
// inflight at a time, then reads every counter back and checks it holds its number of calls.
func (l *loader) actors(ctx context.Context, tag string, ids, inflight, calls int) Result {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout())
	defer cancel()
	id := func(i int) string { return fmt.Sprintf("%s-a%d", tag, i%ids) }
	invoke := func(actorID, method, data string) (int, error) {
		r, err := l.client.InvokeActor(ctx, &dapr.InvokeActorRequest{ActorType: counterType, ActorID: actorID, Method: method, Data: []byte(data)})
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(string(r.Data))
	}
	var t tally
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for range inflight {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= calls {
					return
				}
				start := time.Now()
				_, err := invoke(id(i), "Add", "1")
				t.add(time.Since(start), err)
			}
		})
	}
	wg.Wait()
	r := t.result(fmt.Sprintf("actors:%d:%d:%d", ids, inflight, calls), calls, begin)

	// Every counter holds exactly its number of calls (a lost or doubled save shows here).
	wrong := 0
	var firstWrong error
	for a := range min(ids, calls) {
		want := calls / ids
		if a < calls%ids {
			want++
		}
		r.Checks++
		got, err := invoke(id(a), "Get", "")
		if err == nil && got != want {
			err = fmt.Errorf("counter %s holds %d, want %d", id(a), got, want)
		}
		if err != nil {
			wrong++
			firstWrong = errors.Join(firstWrong, err)
			if wrong > 5 {
				break
			}
		}
	}
	if wrong > 0 {
		r.Failures += wrong
		r.Ok = max(0, r.Ok-wrong)
		if r.FirstError == "" {
			r.FirstError = firstWrong.Error()
		}
	}
	return r
}
