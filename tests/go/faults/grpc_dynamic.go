package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The gRPC doors' client for statestore.v1, built at run time from the descriptors the server
// itself serves over reflection: no generated code in the repository, and the messages are
// always the ones the binary under test speaks, so the client cannot drift from the proto.

const grpcService = "statestore.v1.StateStore"

// grpcAPI is statestore.v1 as the server described it.
type grpcAPI struct {
	set, get, watch, getMany protoreflect.MethodDescriptor
}

// method is the full name grpc-go wants: /package.Service/Method.
func method(m protoreflect.MethodDescriptor) string {
	return "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
}

func (a *grpcAPI) in(m protoreflect.MethodDescriptor) *dynamicpb.Message {
	return dynamicpb.NewMessage(m.Input())
}

func (a *grpcAPI) out(m protoreflect.MethodDescriptor) *dynamicpb.Message {
	return dynamicpb.NewMessage(m.Output())
}

// dialGRPC opens a lazy client connection. While its connection is down grpc-go fails every
// call at once with the last dial error, until its reconnect backoff (by default growing to
// 120 s) lets it dial again: a door or watcher would stay away from a restarted replica for
// most of a run, and a watcher that comes back late only gets a snapshot of what it missed,
// which checks less. So the backoff stays short, and redial resets it after a refusal.
func dialGRPC(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
}

// redial makes the next call on c dial at once instead of failing with the cached error.
func redial(c *grpc.ClientConn, err error) {
	if status.Code(err) == codes.Unavailable {
		c.ResetConnectBackoff()
	}
}

var (
	grpcAPIMu     sync.Mutex
	grpcAPICached *grpcAPI
)

// loadGRPCAPI fetches the descriptors once per run, from whichever replica answers first,
// retrying until one does or ctx ends (a replica may be down when a watcher starts).
func loadGRPCAPI(ctx context.Context, conns []*grpc.ClientConn) (*grpcAPI, error) {
	grpcAPIMu.Lock()
	defer grpcAPIMu.Unlock()
	if grpcAPICached != nil {
		return grpcAPICached, nil
	}
	var last error
	for i := 0; ; i++ {
		c := conns[i%len(conns)]
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		api, err := fetchAPI(cctx, c)
		cancel()
		if err == nil {
			grpcAPICached = api
			return api, nil
		}
		last = err
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return nil, fmt.Errorf("statestore.v1 descriptors over reflection: %w", last)
		}
	}
}

func fetchAPI(ctx context.Context, c *grpc.ClientConn) (*grpcAPI, error) {
	st, err := rpb.NewServerReflectionClient(c).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	defer st.CloseSend()
	ask := func(req *rpb.ServerReflectionRequest) ([]*descriptorpb.FileDescriptorProto, error) {
		if err := st.Send(req); err != nil {
			return nil, err
		}
		resp, err := st.Recv()
		if err != nil {
			return nil, err
		}
		if e := resp.GetErrorResponse(); e != nil {
			return nil, fmt.Errorf("reflection: %s", e.GetErrorMessage())
		}
		var out []*descriptorpb.FileDescriptorProto
		for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := new(descriptorpb.FileDescriptorProto)
			if err := proto.Unmarshal(b, fd); err != nil {
				return nil, err
			}
			out = append(out, fd)
		}
		return out, nil
	}
	got := map[string]*descriptorpb.FileDescriptorProto{}
	fds, err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: grpcService}})
	if err != nil {
		return nil, err
	}
	// The server may or may not send the dependencies along: ask for each one missing.
	for len(fds) > 0 {
		fd := fds[0]
		fds = fds[1:]
		if _, ok := got[fd.GetName()]; ok {
			continue
		}
		got[fd.GetName()] = fd
		for _, dep := range fd.GetDependency() {
			if _, ok := got[dep]; ok {
				continue
			}
			more, err := ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: dep}})
			if err != nil {
				return nil, fmt.Errorf("dependency %s: %w", dep, err)
			}
			fds = append(fds, more...)
		}
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, fd := range got {
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, err
	}
	d, err := files.FindDescriptorByName(grpcService)
	if err != nil {
		return nil, err
	}
	svc, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a service", grpcService)
	}
	api := &grpcAPI{}
	for name, m := range map[string]*protoreflect.MethodDescriptor{"Set": &api.set, "Get": &api.get, "Watch": &api.watch, "GetMany": &api.getMany} {
		md := svc.Methods().ByName(protoreflect.Name(name))
		if md == nil {
			return nil, fmt.Errorf("%s has no method %s", grpcService, name)
		}
		*m = md
	}
	return api, nil
}

// field helpers: a missing field is a programming error against the proto, so they panic
// with its name rather than write or read nothing silently.

func fieldOf(m protoreflect.Message, name string) protoreflect.FieldDescriptor {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		panic(fmt.Sprintf("%s has no field %s", m.Descriptor().FullName(), name))
	}
	return fd
}

func setField(m *dynamicpb.Message, name string, v any) {
	m.Set(fieldOf(m, name), protoreflect.ValueOf(v))
}

func getBytes(m *dynamicpb.Message, name string) []byte { return m.Get(fieldOf(m, name)).Bytes() }
func getString(m *dynamicpb.Message, name string) string {
	return m.Get(fieldOf(m, name)).String()
}
func getBool(m *dynamicpb.Message, name string) bool { return m.Get(fieldOf(m, name)).Bool() }

// getEnumName is an enum field's value name (e.g. KIND_SET), or its number if the descriptor
// does not know it.
func getEnumName(m *dynamicpb.Message, name string) string {
	fd := fieldOf(m, name)
	n := m.Get(fd).Enum()
	if ev := fd.Enum().Values().ByNumber(n); ev != nil {
		return string(ev.Name())
	}
	return fmt.Sprint(int32(n))
}

// grpcOutcome classifies an RPC error, as Reply does an HTTP answer: definite refusals are
// Fail; no answer, a dropped connection, a deadline or a server-side failure are Unknown; a
// connection refused while dialing is Fail, since nothing was sent.
func grpcOutcome(err error) (Outcome, string) {
	st, _ := status.FromError(err)
	msg := st.Code().String() + ": " + st.Message()
	switch st.Code() {
	case codes.ResourceExhausted:
		// The server's refusal (storage full, rate limit), unless it is grpc-go refusing an
		// answer too large to read, which came after the server had acted.
		if strings.Contains(st.Message(), "received message larger than max") {
			return Unknown, msg
		}
		return Fail, msg
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.Aborted, codes.OutOfRange,
		codes.Unimplemented:
		return Fail, msg
	case codes.DeadlineExceeded:
		return Unknown, "timeout"
	case codes.Unavailable:
		// grpc-go fails an RPC fast, unsent, while its connection is down; its message then
		// carries the dial error.
		if strings.Contains(st.Message(), "connection refused") && strings.Contains(st.Message(), "dial") {
			return Fail, "refused"
		}
	}
	if errors.Is(err, context.Canceled) || st.Code() == codes.Canceled {
		return Unknown, "canceled"
	}
	return Unknown, msg
}
