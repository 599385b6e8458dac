//! NIFs that exist once per scheduler: the same function, one NIF that
//! runs on a normal scheduler and one that runs on a dirty one. Elixir
//! picks between them (`EXLA.Placement`) by how long the call may take.

/// Declares the NIF `$normal`, on a normal scheduler, and `$dirty`, on the
/// dirty scheduler `$schedule` ("DirtyCpu" or "DirtyIo"), with the same
/// arguments, result and body:
///
/// ```ignore
/// scheduler_variants! {
///     /// Docs of the normal one.
///     fn name;
///     /// Docs of the dirty one.
///     dirty "DirtyIo" fn name_dirty(arg: Type) -> Result { body }
/// }
/// ```
macro_rules! scheduler_variants {
    (
        $(#[$normal_doc:meta])*
        fn $normal:ident;
        $(#[$dirty_doc:meta])*
        dirty $schedule:tt fn $dirty:ident $($signature_and_body:tt)*
    ) => {
        // Token trees, not `ty` fragments: `rustler::nif` reads the
        // argument types as written.
        $(#[$normal_doc])*
        #[rustler::nif]
        fn $normal $($signature_and_body)*

        $(#[$dirty_doc])*
        #[rustler::nif(schedule = $schedule)]
        fn $dirty $($signature_and_body)*
    };
}
