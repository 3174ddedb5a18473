//! The protobuf messages and tonic services of every gRPC API stategate speaks or calls:
//! `statestore.v1`, the Dapr runtime and the Dapr pluggable state component (files under
//! `proto/`, compiled with protox: no system `protoc`), and their descriptors for reflection.

pub mod statestore {
    pub mod v1 {
        tonic::include_proto!("statestore.v1");
    }
}
pub mod dapr {
    pub mod proto {
        pub mod common {
            pub mod v1 {
                tonic::include_proto!("dapr.proto.common.v1");
            }
        }
        pub mod runtime {
            pub mod v1 {
                tonic::include_proto!("dapr.proto.runtime.v1");
            }
        }
        pub mod components {
            pub mod v1 {
                tonic::include_proto!("dapr.proto.components.v1");
            }
        }
    }
}
/// Every file's descriptor, for reflection.
pub const DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("stategate_descriptor");
